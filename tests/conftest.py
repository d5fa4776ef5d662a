"""Shared test fixtures: real tokenizer files built offline (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path
from pydoc_data.topics import topics

import pytest
import tokenizers
from helpers import SIZES, make_store
from hypothesis import settings
from tokenizers import decoders, models, pre_tokenizers, trainers

# Ray (the local instances the tests start, and the multi-node clusters) listens on loopback
# only: on Linux it would take the host's routable address for "127.0.0.1" and listen on every
# interface; with this it keeps 127.0.0.1 (Ray reads it at import, in every process started).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# A request told to slow down waits up to 15 min in all by default; a test whose server throttles
# every request (and forgot TOKENTAPE_IO_THROTTLE_S=0) fails in a minute instead of hanging.
os.environ.setdefault("TOKENTAPE_IO_THROTTLE_S", "60")

EOD = "<|endoftext|>"
BIG_VOCAB_WORDS = 70_000
"""Ordinary words in the big-vocabulary tokenizer: ``w0`` .. ``w69999``."""


def pydoc_texts() -> list[str]:
    """The Python reference's topic texts (about 0.5 MB, shipped with every Python)."""
    return [topics[key] for key in sorted(topics)]


# Shared, noisy machines: no per-example deadline (a slow example is not a failure).
settings.register_profile("tokentape", deadline=None)
# `make fuzz`: the same property and fuzz tests with many more examples each.
settings.register_profile(
    "fuzz", deadline=None, max_examples=int(os.environ.get("TOKENTAPE_FUZZ_EXAMPLES", "5000"))
)
settings.load_profile(os.environ.get("TOKENTAPE_HYPOTHESIS_PROFILE", "tokentape"))


# Markers (registered in pyproject.toml): each test module carries its own, as `pytestmark` or
# on the test.


@pytest.fixture(scope="session")
def hf_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE (vocab 4000, ``<|endoftext|>`` special) trained on the pydoc topics."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000,
        special_tokens=[EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(pydoc_texts(), trainer=trainer)
    path = tmp_path_factory.mktemp("hf-bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def gpt2_tiktoken() -> Path:
    """The GPT-2 ranks file in ``../shared/tokenizers`` (or ``$TOKENTAPE_GPT2_TIKTOKEN``)."""
    default = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "gpt2.tiktoken"
    path = Path(os.environ.get("TOKENTAPE_GPT2_TIKTOKEN", default))
    if not path.is_file():
        message = f"GPT-2 ranks file not found at {path} (set TOKENTAPE_GPT2_TIKTOKEN)"
        if os.environ.get("CI"):  # CI has ../shared beside the clone: these tests must run
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def big_vocab_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer with 70,002 ids: ``<|endoftext|>`` = 0, ``[UNK]`` = 1, ``wK`` = K+2.

    ``big_vocab_text()`` encodes to ids above 65,535, so a store needs uint32.
    """
    vocab = {EOD: 0, "[UNK]": 1}
    vocab.update({f"w{k}": k + 2 for k in range(BIG_VOCAB_WORDS)})
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([EOD])
    path = tmp_path_factory.mktemp("hf-big") / "tokenizer.json"
    tok.save(str(path))
    return path


def big_vocab_text() -> str:
    """Ordinary text that the big-vocabulary tokenizer maps to ids above 65,535."""
    return "w0 w65534 w65535 w69999 unknown"


@pytest.fixture(scope="session")
def big_vocab_sample() -> str:
    """``big_vocab_text()`` as a fixture."""
    return big_vocab_text()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port) for the whole session; the object-storage
    stack is a dev dependency, so it is skipped only where genuinely absent (and fails in CI)."""
    import objstore as s3mod

    missing = s3mod.available()
    if missing is not None:
        message = f"object-storage tests need {missing} (pip install -e '.[dev,s3]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = s3mod.S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket on the session's S3 server, with the AWS variables pointing at it."""
    import objstore as s3mod

    for key, value in s3mod.s3_environment(s3_server.endpoint).items():
        monkeypatch.setenv(key, value)
    return s3mod.new_bucket(s3_server.endpoint)


@pytest.fixture(scope="session")
def mixture_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three stores of ``helpers.PLAN`` (web, code, math), built once for the session under
    ``ROOT/stores``; tests read them and write nothing there."""
    root = tmp_path_factory.mktemp("mixture")
    for name, n in SIZES.items():
        make_store(root, name, n)
    return root
