//! Compiles the C shim against rdma-core's headers and links librdmacm and libibverbs. Without
//! the headers the build stops with one line saying which packages to install.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    let dirs = ["/usr/include", "/usr/local/include"];
    for header in ["rdma/rdma_cma.h", "infiniband/verbs.h"] {
        if !dirs.iter().any(|d| Path::new(d).join(header).exists()) {
            panic!(
                "nvmf-rdma (the `rdma` feature) needs rdma-core's development files: {header} was not found. \
                 Install librdmacm-dev and libibverbs-dev (Debian/Ubuntu) or rdma-core-devel (Fedora), \
                 or build without `--features rdma`."
            );
        }
    }
    cc::Build::new().file("src/shim.c").warnings(true).compile("nvmf_rdma_shim");
    println!("cargo:rustc-link-lib=rdmacm");
    println!("cargo:rustc-link-lib=ibverbs");
}
