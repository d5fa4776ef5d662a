"""``python -m tokentape``: the command-line program."""

from tokentape._src.program import main

raise SystemExit(main())
