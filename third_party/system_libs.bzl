"""Detects system libraries and writes them as targets of @loom_deps.

Modelled on XLA's cuda_configure: a BUILD file is always written. A library
that is present becomes a cc_library carrying its flags; one that is missing
becomes a cc_library that is incompatible with every platform, so
`bazel build //...` skips exactly the targets that need it (and the targets
that depend on them) while the rest still builds. The reason and the install
hint are printed at configure time and kept in @loom_deps//:MISSING.txt.

Overrides (pass with --repo_env=NAME=VALUE):
  LOOM_CUDA_PATH   CUDA toolkit root (default /usr/local/cuda).
  LOOM_CUDNN_FRONTEND_PATH  the include directory holding cudnn_frontend.h
                   (default: found through python3's site-packages, where
                   `pip install nvidia-cudnn-frontend` puts it).
  LOOM_DISABLE     comma-separated library names to treat as missing
                   (e.g. "ucx,mpi"), for testing the skip path.

Besides libraries: "libfuzzer" is clang++ with its libFuzzer runtime
(defs.bzl's CLANGXX is its path), for fuzz targets that genrules build.
"""

_ABSL_MODULES = [
    "absl_flags",
    "absl_flags_parse",
    "absl_flags_usage",
    "absl_flags_marshalling",
    "absl_status",
    "absl_statusor",
    "absl_str_format",
    "absl_strings",
    "absl_synchronization",
    "absl_time",
    "absl_random_random",
    "absl_hash",
    "absl_raw_hash_set",
]

_APT = "sudo apt-get install -y {}  (or run tools/setup.sh)"

def _quote(s):
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\""

def _qlist(items):
    return "[" + ", ".join([_quote(i) for i in items]) + "]"

def _run(ctx, args):
    """Runs a command; returns stdout or None on failure."""
    tool = ctx.which(args[0])
    if tool == None:
        return None
    res = ctx.execute([tool] + args[1:])
    if res.return_code != 0:
        return None
    return res.stdout.strip()

def _pkg_config(ctx, modules):
    """Returns (cflags, libs) lists for pkg-config modules, or None."""
    cflags = _run(ctx, ["pkg-config", "--cflags"] + modules)
    libs = _run(ctx, ["pkg-config", "--libs"] + modules)
    if cflags == None or libs == None:
        return None
    return ([f for f in cflags.split(" ") if f], [f for f in libs.split(" ") if f])

def _exists(ctx, path):
    return ctx.path(path).exists

def _lib(name, linkopts = [], copts = [], hdrs = None, includes = [], deps = [], doc = ""):
    return struct(name = name, ok = True, linkopts = linkopts, copts = copts, hdrs = hdrs, includes = includes, deps = deps, doc = doc, why = "")

def _missing(name, why):
    return struct(name = name, ok = False, why = why, linkopts = [], copts = [], hdrs = None, includes = [], deps = [], doc = "")

def _detect_absl(ctx):
    r = _pkg_config(ctx, _ABSL_MODULES)
    if r == None:
        return _missing("absl", "Abseil not found by pkg-config (" + " ".join(_ABSL_MODULES[:3]) + " ...). " + _APT.format("libabsl-dev"))
    return _lib("absl", linkopts = r[1], copts = r[0], doc = "Abseil (flags, status, strings, synchronization, time)")

def _detect_gtest(ctx):
    r = _pkg_config(ctx, ["gtest", "gmock"])
    if r == None:
        return _missing("gtest", "GoogleTest/GoogleMock not found by pkg-config (gtest, gmock). " + _APT.format("libgtest-dev libgmock-dev"))
    return _lib("gtest", linkopts = r[1], copts = r[0], doc = "GoogleTest and GoogleMock")

def _detect_benchmark(ctx):
    if not _exists(ctx, "/usr/include/benchmark/benchmark.h"):
        return _missing("benchmark", "Google Benchmark header /usr/include/benchmark/benchmark.h not found. " + _APT.format("libbenchmark-dev"))
    return _lib("benchmark", linkopts = ["-lbenchmark", "-lpthread"], doc = "Google Benchmark")

def _detect_protobuf(ctx):
    r = _pkg_config(ctx, ["protobuf"])
    protoc = ctx.which("protoc")
    if r == None or protoc == None:
        return _missing("protobuf", "Protobuf library (pkg-config protobuf) or protoc not found. " + _APT.format("libprotobuf-dev protobuf-compiler"))
    ctx.symlink(protoc, "protoc_bin/protoc")
    return _lib("protobuf", linkopts = r[1], copts = r[0], doc = "Protocol Buffers runtime (protoc in :protoc)")

def _detect_dnnl(ctx):
    if not _exists(ctx, "/usr/include/oneapi/dnnl/dnnl.h"):
        return _missing("dnnl", "oneDNN header oneapi/dnnl/dnnl.h not found. " + _APT.format("libdnnl-dev"))
    return _lib("dnnl", linkopts = ["-ldnnl"], doc = "oneDNN: Loom's CPU GEMM (fastest measured on Zen 5, see BENCHMARKS.md)")

def _detect_openblas(ctx):
    r = _pkg_config(ctx, ["openblas"])
    if r == None:
        return _missing("openblas", "OpenBLAS not found by pkg-config (openblas). " + _APT.format("libopenblas-dev"))
    return _lib("openblas", linkopts = r[1], copts = r[0], doc = "OpenBLAS (reference in //core:bench)")

def _detect_re2(ctx):
    r = _pkg_config(ctx, ["re2"])
    if r == None:
        return _missing("re2", "RE2 not found by pkg-config (re2). " + _APT.format("libre2-dev"))
    return _lib("re2", linkopts = r[1], doc = "RE2 regular expressions (GPT-2 pre-tokenizer)")

def _detect_json(ctx):
    if not _exists(ctx, "/usr/include/nlohmann/json.hpp"):
        return _missing("json", "nlohmann/json.hpp not found. " + _APT.format("nlohmann-json3-dev"))
    return _lib("json", doc = "nlohmann JSON (header-only; vocab.json, JSON-lines input)")

def _detect_sentencepiece(ctx):
    # Only for //train/data:libloom_sentencepiece.so, which the tokenizer loads
    # with dlopen: never link it into a binary. Debian's libsentencepiece
    # bundles protobuf 3.14 and exports its symbols, which clash with the
    # system's libprotobuf (the process aborts at start-up).
    r = _pkg_config(ctx, ["sentencepiece"])
    if r == None:
        return _missing("sentencepiece", "SentencePiece not found by pkg-config (sentencepiece). " + _APT.format("libsentencepiece-dev"))
    return _lib("sentencepiece", linkopts = [f for f in r[1] if f != "-lsentencepiece_train"], copts = r[0], doc = "SentencePiece (loaded by //train/data's shim, never linked)")

def _detect_mpi(ctx):
    compile = _run(ctx, ["mpicc", "--showme:incdirs"])
    link = _run(ctx, ["mpicc", "--showme:link"])
    mpirun = ctx.which("mpirun")
    if compile == None or link == None or mpirun == None:
        return _missing("mpi", "OpenMPI not found (mpicc --showme failed or mpirun missing). " + _APT.format("libopenmpi-dev openmpi-bin"))
    incdirs = [d for d in compile.split(" ") if d]
    includes = []
    for i, d in enumerate(incdirs):
        ctx.symlink(d, "mpi/include{}".format(i))
        includes.append("mpi/include{}".format(i))
    ctx.symlink(mpirun, "mpi/mpirun")
    return _lib(
        "mpi",
        linkopts = [f for f in link.split(" ") if f],
        includes = includes,
        hdrs = ["mpi/include{}/**".format(i) for i in range(len(incdirs))],
        doc = "OpenMPI (mpirun in :mpirun)",
    )

def _detect_ucx(ctx):
    r = _pkg_config(ctx, ["ucx"])
    if r == None:
        return _missing("ucx", "UCX not found by pkg-config (ucx). " + _APT.format("libucx-dev"))
    return _lib("ucx", linkopts = r[1], copts = r[0], doc = "UCX (UCP)")

def _detect_crypto(ctx):
    r = _pkg_config(ctx, ["libcrypto"])
    if r == None or not _exists(ctx, "/usr/include/openssl/hmac.h"):
        return _missing("crypto", "OpenSSL's libcrypto not found by pkg-config (libcrypto). " + _APT.format("libssl-dev"))
    return _lib("crypto", linkopts = r[1], copts = r[0], doc = "OpenSSL libcrypto: the TCP store's HMAC-SHA-256 handshake and nonces")

def _detect_libfuzzer(ctx):
    # Not a library to link: clang++ and its libFuzzer runtime, with which
    # //comm:store_frame_fuzzer is built (a genrule; Bazel's C++ toolchain is gcc).
    clang = ctx.which("clang++")
    if clang == None:
        return (_missing("libfuzzer", "clang++ not found (libFuzzer targets are built with clang). " + _APT.format("clang libclang-rt-dev")), "")
    probe = ctx.execute([clang, "-print-file-name=libclang_rt.fuzzer-x86_64.a"])
    found = probe.stdout.strip()
    if probe.return_code != 0 or not found.startswith("/") or not _exists(ctx, found):
        return (_missing("libfuzzer", "clang's libFuzzer runtime (libclang_rt.fuzzer-x86_64.a) not found. " + _APT.format("libclang-rt-dev")), "")
    return (_lib("libfuzzer", doc = "clang++ with libFuzzer (for fuzz targets built by genrules; nothing to link)"), str(clang))

def _detect_cuda(ctx, root):
    """Returns (cuda_runtime, cublas, nccl) library structs."""
    hint = "Install the CUDA toolkit or point --repo_env=LOOM_CUDA_PATH at it."
    if not _exists(ctx, root + "/bin/nvcc") or not _exists(ctx, root + "/include/cuda_runtime.h"):
        why = "CUDA toolkit not found at {} (no bin/nvcc or include/cuda_runtime.h). {}".format(root, hint)
        return [_missing("cuda_runtime", why), _missing("cublas", why), _missing("nccl", why)]
    ctx.symlink(root + "/include", "cuda/include")
    lib64 = root + "/lib64"
    base = ["-L" + lib64, "-Wl,-rpath," + lib64]
    hdrs = ["cuda/include/**"]
    includes = ["cuda/include", "cuda/include/cccl"]
    rt = _lib("cuda_runtime", linkopts = base + ["-lcudart"], hdrs = hdrs, includes = includes, doc = "CUDA runtime at " + root)
    if _exists(ctx, lib64 + "/libcublas.so") and _exists(ctx, root + "/include/cublas_v2.h"):
        cublas = _lib("cublas", linkopts = base + ["-lcublasLt", "-lcublas"], deps = [":cuda_runtime"], doc = "cuBLAS and cuBLASLt")
    else:
        cublas = _missing("cublas", "cuBLAS not found under {} (lib64/libcublas.so). {}".format(root, hint))
    if _exists(ctx, lib64 + "/libnccl.so") and _exists(ctx, root + "/include/nccl.h"):
        nccl = _lib("nccl", linkopts = base + ["-lnccl"], deps = [":cuda_runtime"], doc = "NCCL")
    else:
        nccl = _missing("nccl", "NCCL not found under {} (lib64/libnccl.so, include/nccl.h). {}".format(root, hint))
    return [rt, cublas, nccl]

# Where pip puts the headers of nvidia-cudnn-frontend: <site-packages>/include.
_FIND_FRONTEND_PY = """
import os, site, sysconfig
dirs = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
try:
    dirs += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
for d in dirs:
    if d and os.path.isfile(os.path.join(d, "include", "cudnn_frontend.h")):
        print(os.path.join(d, "include"))
        break
"""

def _detect_cudnn_frontend(ctx, root, rt):
    """cudnn-frontend (header-only) over cuDNN's headers from the CUDA toolkit.

    Compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: the frontend resolves
    cudnn* symbols from a handle that //core/cuda/cudnn dlopens at run time, so
    nothing links libcudnn and a machine without it still loads the binaries.
    """
    name = "cudnn_frontend"
    hint = "pip install nvidia-cudnn-frontend==1.32.0 (or run tools/setup.sh), or point --repo_env=LOOM_CUDNN_FRONTEND_PATH at its include directory."
    if not rt.ok:
        return _missing(name, rt.why)
    if not _exists(ctx, root + "/include/cudnn.h") or not _exists(ctx, root + "/include/cudnn_version.h"):
        return _missing(name, "cuDNN headers not found under {}/include (cudnn.h, cudnn_version.h). Install cuDNN 9 into the CUDA toolkit.".format(root))
    inc = ctx.os.environ.get("LOOM_CUDNN_FRONTEND_PATH", "")
    if not inc:
        inc = _run(ctx, ["python3", "-c", _FIND_FRONTEND_PY]) or ""
    if not inc or not _exists(ctx, inc + "/cudnn_frontend.h"):
        return _missing(name, "cudnn-frontend headers (cudnn_frontend.h) not found{}. {}".format(" in " + inc if inc else " in python3's site-packages", hint))
    ctx.symlink(inc, "cudnn_frontend/include")
    return _lib(
        name,
        copts = ["-DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", "-DLOOM_CUDA_LIB64=" + root + "/lib64"],
        linkopts = ["-ldl"],
        hdrs = ["cudnn_frontend/include/**"],
        includes = ["cudnn_frontend/include"],
        deps = [":cuda_runtime"],
        doc = "cudnn-frontend headers at " + inc + " (libcudnn loaded at run time)",
    )

def _target(lib):
    lines = ["cc_library("]
    lines.append("    name = {},".format(_quote(lib.name)))
    if lib.ok:
        if lib.hdrs:
            lines.append("    hdrs = glob({}),".format(_qlist(lib.hdrs)))
        if lib.includes:
            lines.append("    includes = {},".format(_qlist(lib.includes)))
        defines = [f[2:] for f in lib.copts if f.startswith("-D")]
        if defines:
            lines.append("    defines = {},".format(_qlist(defines)))
        if lib.linkopts:
            lines.append("    linkopts = {},".format(_qlist(lib.linkopts)))
        if lib.deps:
            lines.append("    deps = {},".format(_qlist(lib.deps)))
    else:
        lines.append("    # MISSING: " + lib.why)
        lines.append("    target_compatible_with = [\":missing\"],")
    lines.append("    visibility = [\"//visibility:public\"],")
    lines.append(")\n")
    return "\n".join(lines)

def _system_libs_impl(ctx):
    disabled = [d.strip() for d in ctx.os.environ.get("LOOM_DISABLE", "").split(",") if d.strip()]
    cuda_root = ctx.os.environ.get("LOOM_CUDA_PATH", "/usr/local/cuda")
    libfuzzer, clangxx = _detect_libfuzzer(ctx)
    cuda = _detect_cuda(ctx, cuda_root)
    libs = [
        _detect_absl(ctx),
        _detect_gtest(ctx),
        _detect_benchmark(ctx),
        _detect_protobuf(ctx),
        _detect_dnnl(ctx),
        _detect_openblas(ctx),
        _detect_re2(ctx),
        _detect_json(ctx),
        _detect_sentencepiece(ctx),
        _detect_mpi(ctx),
        _detect_ucx(ctx),
        _detect_crypto(ctx),
        libfuzzer,
    ] + cuda + [_detect_cudnn_frontend(ctx, cuda_root, cuda[0])]
    gtest = libs[1]
    libs.insert(2, _lib("gtest_main", linkopts = ["-lgtest_main"], deps = [":gtest"]) if gtest.ok else _missing("gtest_main", gtest.why))
    libs = [
        _missing(l.name, "disabled by LOOM_DISABLE") if l.name in disabled else l
        for l in libs
    ]

    build = [
        "# Generated by //third_party:system_libs.bzl. Do not edit.",
        "package(default_visibility = [\"//visibility:public\"])",
        "",
        "# No platform carries this value: targets that list it are skipped.",
        "constraint_setting(name = \"availability\")",
        "constraint_value(name = \"missing\", constraint_setting = \":availability\")",
        "",
    ]
    for l in libs:
        build.append(_target(l))
    by_name = {l.name: l for l in libs}
    if by_name["protobuf"].ok:
        build.append("exports_files([\"protoc_bin/protoc\"])\nalias(name = \"protoc\", actual = \"protoc_bin/protoc\")\n")
    else:
        build.append("genrule(name = \"protoc\", outs = [\"protoc_missing\"], cmd = \"false\", target_compatible_with = [\":missing\"])\n")
    if by_name["mpi"].ok:
        build.append("exports_files([\"mpi/mpirun\"])\nalias(name = \"mpirun\", actual = \"mpi/mpirun\")\n")
    else:
        build.append("genrule(name = \"mpirun\", outs = [\"mpirun_missing\"], cmd = \"false\", target_compatible_with = [\":missing\"])\n")
    build.append("exports_files([\"MISSING.txt\"])\n")
    ctx.file("BUILD", "\n".join(build))

    report = []
    for l in libs:
        if not l.ok:
            report.append("{}: {}".format(l.name, l.why))
            print("loom: '{}' is missing, its targets will be skipped: {}".format(l.name, l.why))
    ctx.file("MISSING.txt", "\n".join(report) + "\n")

    defs = [
        "# Generated by //third_party:system_libs.bzl. Do not edit.",
        "CUDA_PATH = {}".format(_quote(cuda_root)),
        "NVCC = {}".format(_quote(cuda_root + "/bin/nvcc")),
        "CLANGXX = {}".format(_quote(clangxx if "libfuzzer" not in disabled else "")),
        "AVAILABLE = {",
    ]
    for l in libs:
        defs.append("    {}: {},".format(_quote(l.name), "True" if l.ok else "False"))
    defs.append("}")
    defs.append("""
def requires(*names):
    \"\"\"target_compatible_with for a target that needs these libraries.\"\"\"
    for n in names:
        if not AVAILABLE[n]:
            return ["@loom_deps//:missing"]
    return []

def if_available(name, yes, no = []):
    return yes if AVAILABLE[name] else no
""")
    ctx.file("defs.bzl", "\n".join(defs))

system_libs_configure = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["LOOM_CUDA_PATH", "LOOM_CUDNN_FRONTEND_PATH", "LOOM_DISABLE", "PATH", "PKG_CONFIG_PATH"],
)
