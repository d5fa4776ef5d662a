"""``python -m tokentape``: the command-line program."""

from tokentape._src.cli.main import main

raise SystemExit(main())
