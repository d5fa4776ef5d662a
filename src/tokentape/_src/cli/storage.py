"""The object-storage flag shared by the commands that read or write object URLs."""

from __future__ import annotations

import argparse
from typing import Any

from tokentape._src.objects.client import is_url, parse_storage_options
from tokentape.errors import InputError, OutputError

STORAGE_HELP = (
    "fsspec options for s3:// (gs://, az://) paths, as a JSON object, e.g. "
    '\'{"endpoint_url": "http://minio:9000"}\'; credentials come from the AWS_* variables '
    "or a profile (never printed or written)"
)


def storage_options_arg(text: str) -> dict[str, Any]:
    """argparse type of ``--storage-options``: a JSON object."""
    try:
        return parse_storage_options(text, "--storage-options")
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--storage-options: ")) from None


def add_storage_options(p: argparse.ArgumentParser) -> None:
    """``--storage-options JSON`` (into ``args.storage_options``, default ``{}``)."""
    p.add_argument(
        "--storage-options", type=storage_options_arg, default={}, metavar="JSON", help=STORAGE_HELP
    )


def local_only(flag: str, value: str | None, what: str, *, read: bool = False) -> None:
    """Refuse an object URL given for ``flag``, which names ``what`` on local disk (a tree of
    files a command writes or keeps; with ``read``, one it reads), in one line naming the URL
    whole."""
    if value is None or not is_url(value):
        return
    if read:
        raise InputError(
            f"{flag} {value}: {what} is read from local disk (or a mounted file system), not "
            "from an object URL; copy it first (e.g. `aws s3 sync` or `s5cmd cp`), or mount "
            "the bucket"
        )
    raise OutputError(
        f"{flag} {value}: {what} on local disk (or a mounted file system), not at an "
        "object URL; give a local directory"
    )
