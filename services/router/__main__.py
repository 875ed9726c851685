"""python -m services.router"""
from libs.service import common_args, run_service, settings_from
from services.thin import run_following_catalog

NAME = "router"


def main() -> None:
    args = common_args("shardlog router").parse_args()
    settings = settings_from(args)
    run_service(NAME, lambda: run_following_catalog(settings, NAME))


if __name__ == "__main__":
    main()
