"""The event loop a processor worker runs on: uvloop where it is installed.

faust, aiokafka and the worker's rounds run on asyncio. The worker has two loops: the main
thread's (rounds, flushes, the producer) and faust's consumer thread's (aiokafka's
fetches and their responses). uvloop (libuv in C, MagicStack's, which faust documents as
``faust -L uvloop``) runs both for less CPU than the standard library's loop: 3-11 % of
an idle worker's CPU and a few per cent of its paced CPU per event on the issue-23 benches
(a drain, nearly all fold, does not separate from the box; docs/processors.md, "uvloop
under the worker"). Nothing in runwatch depends on either loop's internals, and both run
the same rounds, so verdicts are the same either way.

`install` sets the asyncio policy before faust makes its first loop, so the main loop and
every loop made later (the consumer thread's) are uvloop's.
"""

from __future__ import annotations

import asyncio
import importlib
import logging

from runwatch.processors.settings import EventLoop

log = logging.getLogger(__name__)


def install(choice: EventLoop) -> str:
    """Make the loops this process creates from now on ``choice``'s, where that can be.

    Rules, in order:

    1. ``asyncio``: the standard library's loop; the policy is left as it is.
    2. ``uvloop`` and uvloop imports: its policy is installed.
    3. ``uvloop`` that does not import (a platform without its wheel, an install that
       left it out): the standard library's loop, with a warning saying so.

    Call it before anything creates a loop (faust's app takes one when it is made).

    Args:
        choice: The loop asked for (`processors.settings.ProcessorEnv.event_loop`).

    Returns:
        The name of the loop the process now makes: ``uvloop`` or ``asyncio``.
    """
    if choice == "asyncio":  # 1
        return "asyncio"
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:  # 3
        log.warning("uvloop does not import (%s); the worker runs on asyncio's own loop", exc)
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # 2
    return "uvloop"


__all__ = ["install"]
