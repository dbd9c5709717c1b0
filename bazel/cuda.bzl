"""cuda_library: compiles .cu files with nvcc for Hopper and links them through
the C++ toolchain, so CUDA code is an ordinary cc_library to its dependents.

Machine code for sm_90 plus compute_90 PTX (so newer GPUs can JIT it). Include
paths and defines come from the deps' CcInfo, so a .cu file sees the same
headers as C++ code. When CUDA is missing the target is skipped (see
//third_party:system_libs.bzl).
"""

load("@loom_deps//:defs.bzl", "NVCC", "requires")

_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# The host compiler warns as for C++ (.bazelrc, LOOM_COPTS). In this
# workspace's own code nvcc's and the host compiler's warnings are errors, as
# .bazelrc makes them for C++ (#35); not where Loom is an external repository.
_HOST_WARNINGS = ["-Xcompiler", "-Wall,-Wextra,-Wno-sign-compare,-Wno-unused-parameter"]
_WERROR = ["-Werror", "all-warnings", "-Xcompiler", "-Werror"]

def _nvcc_compile_impl(ctx):
    cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d]
    comp = cc_common.merge_cc_infos(cc_infos = cc_infos).compilation_context
    flags = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-ccbin", ctx.attr.host_compiler] + _GENCODE
    flags += _HOST_WARNINGS
    if ctx.label.workspace_name == "":
        flags += _WERROR
    for d in comp.defines.to_list() + comp.local_defines.to_list():
        flags.append("-D" + d)
    for i in comp.includes.to_list() + comp.quote_includes.to_list() + comp.system_includes.to_list():
        flags.append("-I" + i)
    flags += ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    flags += ctx.attr.copts
    outs = []
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [comp.headers])
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("_objs/{}/{}.pic.o".format(ctx.label.name, src.basename[:-len(src.extension) - 1]))
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = flags + ["-c", src.path, "-o", out.path],
            inputs = inputs,
            outputs = [out],
            mnemonic = "Nvcc",
            progress_message = "nvcc {}".format(src.short_path),
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_nvcc_compile = rule(
    implementation = _nvcc_compile_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "nvcc": attr.string(default = NVCC),
        "host_compiler": attr.string(default = "/usr/bin/gcc"),
    },
)

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc (sm_90 + compute_90 PTX)."""
    compat = requires("cuda_runtime")
    cuda_deps = deps + ["@loom_deps//:cuda_runtime"]
    _nvcc_compile(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = cuda_deps,
        copts = copts,
        target_compatible_with = compat,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = cuda_deps,
        target_compatible_with = compat,
        visibility = visibility,
        **kwargs
    )
