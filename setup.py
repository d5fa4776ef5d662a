"""The compiled kernels; everything else about the package is in pyproject.toml.

The permutation walk (``_cwalk``) and megatron-core's blending rule (``_cgreedy``, for a
Megatron-LM run's blend that was never saved) are optional: where they cannot be built (no C
compiler, no Python headers), the install goes on without them and the same results come from
their numpy and Python paths (``tokentape --version`` says which walk runs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tokentape._src.tape._cwalk",
            ["src/tokentape/_src/tape/_cwalk.c"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        ),
        Extension(
            "tokentape._src.megatron._cgreedy",
            ["src/tokentape/_src/megatron/_cgreedy.c"],
            # ISO C: a multiply and a subtract are never fused, as in megatron-core's helpers
            extra_compile_args=["-O3", "-std=c99", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
