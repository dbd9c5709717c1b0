"""One macro that declares every external repository Loom needs.

An embedding workspace calls it too (see tests/embed/WORKSPACE):

    local_repository(name = "loom", path = "...")
    load("@loom//third_party:repositories.bzl", "loom_dependencies")
    loom_dependencies()
"""

load("//third_party:shims.bzl", "coverage_tools_shim", "rules_cc_shim", "rules_java_shim")
load("//third_party:system_libs.bzl", "system_libs_configure")

def loom_dependencies():
    """Declares the offline shims and @loom_deps (system libraries as targets)."""
    if not native.existing_rule("rules_cc"):
        rules_cc_shim(name = "rules_cc")
    if not native.existing_rule("rules_java"):
        rules_java_shim(name = "rules_java")
    if not native.existing_rule("remote_coverage_tools"):
        coverage_tools_shim(name = "remote_coverage_tools")
    if not native.existing_rule("loom_deps"):
        system_libs_configure(name = "loom_deps")
