"""python -m services.balancer"""

from libs.service import common_args, run_service, settings_from
from services.balancer.server import Balancer


def main() -> None:
    settings = settings_from(common_args("shardlog balancer").parse_args())
    run_service("balancer", lambda: Balancer(settings).run())


if __name__ == "__main__":
    main()
