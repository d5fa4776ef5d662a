"""The compiled permutation kernel; everything else about the package is in pyproject.toml.

The kernel is optional: where it cannot be built (no C compiler, no Python headers), the
install goes on without it and the permutation runs its numpy path, which gives identical
results (``tokentape --version`` says which one runs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tokentape._src.tape._cwalk",
            ["src/tokentape/_src/tape/_cwalk.c"],
            extra_compile_args=["-O3", "-std=c99"],
            optional=True,
        )
    ]
)
