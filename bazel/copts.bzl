"""Compiler flags shared by every Loom package (one place to change them)."""

LOOM_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
]

# Kernels: OpenMP for the two cores, and vectorisation.
LOOM_KERNEL_COPTS = LOOM_COPTS + ["-fopenmp", "-O3"]
LOOM_KERNEL_LINKOPTS = ["-fopenmp"]
