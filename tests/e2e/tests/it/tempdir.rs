//! The end-to-end tests' scratch directories leave nothing in /tmp, also when a test fails.

#[test]
fn temp_dir_is_removed_when_its_test_panics() {
    let mut seen = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let dir = nvmf_e2e::TempDir::new();
        std::fs::write(dir.join("target.toml"), "[target]\n").unwrap();
        seen = Some(dir.path().to_path_buf());
        panic!("a failing assertion");
    }));
    assert!(outcome.is_err());
    let path = seen.expect("the closure ran");
    assert!(path.starts_with(std::env::temp_dir()) && !path.exists(), "{} left behind", path.display());
}

#[test]
fn temp_dirs_are_distinct() {
    let (a, b) = (nvmf_e2e::TempDir::new(), nvmf_e2e::TempDir::new());
    assert_ne!(a.path(), b.path());
    assert!(a.is_dir() && b.is_dir());
}
