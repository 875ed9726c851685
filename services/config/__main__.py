"""python -m services.config — run one config server instance (active or standby)."""

from libs.service import common_args, run_service, settings_from
from services.config.server import ConfigServer


def main() -> None:
    p = common_args("shardlog config server")
    p.add_argument("--instance", default="0", help="instance name, to run standbys beside the active one")
    args = p.parse_args()
    settings = settings_from(args)
    run_service("config", lambda: ConfigServer(settings, instance=args.instance).run())


if __name__ == "__main__":
    main()
