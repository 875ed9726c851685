"""python -m services.dashboard [--port 8090] [--bind 127.0.0.1]"""

from libs.service import common_args, run_service, settings_from
from services.dashboard.server import Dashboard, load_figures


def main() -> None:
    p = common_args("shardlog dashboard")
    p.add_argument(
        "--port", type=int, help="the HTTP port (default: $SHARDLOG_DASHBOARD_PORT or 8090; 0: any free port)"
    )
    p.add_argument("--bind", help="the address it listens on (default: $SHARDLOG_DASHBOARD_BIND or 127.0.0.1)")
    args = p.parse_args()
    settings = settings_from(args)
    run_service(
        "dashboard",
        lambda: Dashboard(settings, port=args.port, bind=args.bind, figures=load_figures(settings)).run(),
    )


if __name__ == "__main__":
    main()
