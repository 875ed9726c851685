"""The `shardlog` operator command (typer + rich): human output, or `--json`."""
