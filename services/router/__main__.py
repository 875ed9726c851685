"""python -m services.router [--instance NAME]"""

from libs.service import common_args, run_service, settings_from
from services.router.server import RouterServer


def main() -> None:
    p = common_args("shardlog router")
    p.add_argument("--instance", help="instance name (default: random); several routers share the load")
    args = p.parse_args()
    settings = settings_from(args)
    run_service("router", lambda: RouterServer(settings, args.instance).run())


if __name__ == "__main__":
    main()
