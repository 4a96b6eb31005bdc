"""runwatch's version, in one place.

Read by the command line (``--version``), the webhook's User-Agent and the package
metadata (pyproject's ``dynamic = ["version"]``).
"""

__version__ = "0.1.0"
