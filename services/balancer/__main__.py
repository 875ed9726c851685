"""python -m services.balancer"""
from libs.service import common_args, run_service, settings_from
from services.thin import run_following_catalog

NAME = "balancer"


def main() -> None:
    args = common_args("shardlog balancer").parse_args()
    settings = settings_from(args)
    run_service(NAME, lambda: run_following_catalog(settings, NAME))


if __name__ == "__main__":
    main()
