"""python -m services.shard --shard-id s0 [--instance 1]"""

from libs.service import common_args, run_service, settings_from
from libs.topics import SHARD_ID
from services.shard.server import ShardServer


def main() -> None:
    p = common_args("shardlog shard")
    p.add_argument("--shard-id", required=True, help="this shard's id, as added with `shardlog add-shard`")
    p.add_argument(
        "--instance",
        default="0",
        help="instance name, to run a standby beside the active one (its own store: shard-<id>-<instance>)",
    )
    args = p.parse_args()
    if not SHARD_ID.match(args.shard_id):
        p.error(f"invalid shard id {args.shard_id!r}: use 1-64 of A-Z a-z 0-9 _ -")
    settings = settings_from(args)
    server = ShardServer(settings, args.shard_id, instance=args.instance)
    run_service(server.ready_name, server.run)


if __name__ == "__main__":
    main()
