"""What the lower packages share: settings, durable writes, errors, the checkpoint layout.

The base of the house: it imports nothing of runwatch's other packages, and every one of
them may import it (see tests/unit/test_layering.py).
"""
