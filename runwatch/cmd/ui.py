"""`runwatch ui`: serve the web view of the fleet (live table, per-run curves and receipts)."""

from __future__ import annotations

import argparse
import sys

from runwatch.cmd.processors import add_common, detector_config, parse_overrides

HELP = "serve a live web view of the fleet and of each run (curves, verdicts, receipts)"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch ui`."""
    from runwatch.processors.settings import DEFAULT_APP_ID

    add_common(parser)
    parser.add_argument(
        "--app-id",
        help="the processors' app id (default: <prefix>-processors, as for `runwatch "
        f"processors`; {DEFAULT_APP_ID} for the default prefix)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only; the view has no login)",
    )
    parser.add_argument("--port", type=int, default=8470, help="port (default: 8470; 0: any)")
    parser.add_argument(
        "--max-runs",
        type=int,
        default=10_000,
        metavar="N",
        help="keep at most N runs in memory; past it the least recently updated are "
        "dropped (default: %(default)s)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the view may be reached by (its Host header; repeatable); "
        "requests naming any other host are refused against DNS rebinding (default: the "
        "--host address, localhost, 127.0.0.1 and ::1)",
    )


def run(args: argparse.Namespace) -> int:
    """Follow the processors' state and serve the pages until Ctrl-C."""
    from runwatch.admin import warn_if_no_authorizer
    from runwatch.common.errors import UsageError
    from runwatch.common.settings import topic_prefix
    from runwatch.processors.fleet import default_app_id
    from runwatch.reachability import check_reachable
    from runwatch.resolve import resolve_bootstrap
    from runwatch.ui.model import WebviewData
    from runwatch.ui.server import UiServer

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    if args.max_runs < 1:
        raise UsageError(f"--max-runs must be at least 1, got {args.max_runs}")
    cfg = detector_config(parse_overrides(args.overrides, args.shadow))
    bootstrap = resolve_bootstrap(args.bootstrap, check=False)
    prefix = topic_prefix(args.prefix)
    data = WebviewData(
        bootstrap,
        prefix=prefix,
        app_id=args.app_id or default_app_id(prefix),
        cfg=cfg,  # type: ignore[arg-type]
        max_runs=args.max_runs,
    )
    # the local port first (a taken port: one line, exit 1), then the broker (exit 4)
    server = UiServer(data, host=args.host, port=args.port, allow_hosts=args.allow_host)
    try:
        check_reachable(bootstrap)
        warn_if_no_authorizer(bootstrap, prefix, "ui")
        data.start()
    except BaseException:
        server.close()
        raise
    print(f"runwatch ui: serving {server.url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("runwatch ui: stopped", file=sys.stderr)
    finally:
        server.close()
        data.close()
    return 0
