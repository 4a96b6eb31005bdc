"""A real torch DDP training example instrumented with ``producers``.

Run it as ``python examples/train_ddp.py`` or ``python -m examples.train_ddp`` from the repo
root, once per rank, with the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) set.
"""
