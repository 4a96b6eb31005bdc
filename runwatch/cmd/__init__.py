"""One module per `runwatch` subcommand.

Each module defines ``HELP`` (one line), ``configure(parser)`` that adds its arguments and
``run(args) -> int``. Modules import heavy libraries (kafka, faust, torch) inside ``run`` so
that ``runwatch --help`` stays fast.
"""
