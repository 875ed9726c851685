"""python -m services.router [--instance NAME] [--port 27017] [--bind 127.0.0.1]"""

from libs.service import common_args, run_service, settings_from
from services.router.server import RouterServer


def main() -> None:
    p = common_args("shardlog router")
    p.add_argument("--instance", help="instance name (default: random); several routers share the load")
    p.add_argument(
        "--port",
        type=int,
        help="the MongoDB wire port (default: $SHARDLOG_ROUTER_PORT or 27017; 0: any free port)",
    )
    p.add_argument("--bind", help="the address it listens on (default: $SHARDLOG_ROUTER_BIND or 127.0.0.1)")
    args = p.parse_args()
    settings = settings_from(args)
    run_service("router", lambda: RouterServer(settings, args.instance, port=args.port, bind=args.bind).run())


if __name__ == "__main__":
    main()
