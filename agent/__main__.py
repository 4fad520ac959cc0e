"""``python -m agent``: the standalone resource agent (see agent/cli.py and docs/agent.md)."""

from .cli import console_main

if __name__ == "__main__":
    console_main()
