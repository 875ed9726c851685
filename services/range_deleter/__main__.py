"""python -m services.range_deleter"""

from libs.service import common_args, run_service, settings_from
from services.range_deleter.server import RangeDeleter


def main() -> None:
    settings = settings_from(common_args("shardlog range-deleter").parse_args())
    run_service("range-deleter", lambda: RangeDeleter(settings).run())


if __name__ == "__main__":
    main()
