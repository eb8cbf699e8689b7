//! The curated Python stack in the sandbox: data in, analysis, files and plots out. Needs
//! `runcell setup` to have run (scripts/test.sh does it); without it they report as ignored.

mod common;

use std::fs;

use common::*;

fn file<'a>(r: &'a Run, path: &str) -> &'a serde_json::Value {
    r.verdict["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no {path} in {:#}", r.verdict["files"]))
}

fn decode(b64: &str) -> Vec<u8> {
    use std::io::Write;
    let mut c = std::process::Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b64.as_bytes()).unwrap();
    c.wait_with_output().unwrap().stdout
}

#[test]
#[cfg_attr(
    not(host_python_stack),
    ignore = "needs the Python data stack: run `runcell setup`"
)]
fn the_stack_is_installed_and_every_package_imports() {
    let r = run(
        "python",
        "import numpy, pandas, matplotlib, scipy, sympy, PIL, openpyxl\nprint(pandas.__version__, numpy.__version__)",
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "3.1.1 2.4.6\n");
    assert_eq!(r.stderr_out(), "", "no warnings (font cache, config dir)");
}

#[test]
#[cfg_attr(
    not(host_python_stack),
    ignore = "needs the Python data stack: run `runcell setup`"
)]
fn a_csv_in_gives_a_pandas_summary_and_a_derived_csv_out() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("sales.csv");
    fs::write(
        &csv,
        "region,amount\nnorth,10\nsouth,5\nnorth,30\nsouth,15\n",
    )
    .unwrap();
    let spec = format!("{}:data/sales.csv", csv.display());
    let r = run(
        "python",
        r#"
import pandas as pd
df = pd.read_csv("data/sales.csv")
summary = df.groupby("region")["amount"].agg(["sum", "mean"])
print(summary.to_string())
summary.to_csv("out/summary.csv") if __import__("os").makedirs("out", exist_ok=True) is None else None
"#,
        &["--file", &spec],
    );
    r.assert_ok();
    assert_eq!(
        r.stdout(),
        "        sum  mean\nregion           \nnorth    40  20.0\nsouth    20  10.0\n"
    );
    let f = file(&r, "out/summary.csv");
    assert_eq!(f["mime_type"], "text/csv");
    assert_eq!(
        decode(f["content_base64"].as_str().unwrap()),
        b"region,sum,mean\nnorth,40,20.0\nsouth,20,10.0\n"
    );
}

#[test]
#[cfg_attr(
    not(host_python_stack),
    ignore = "needs the Python data stack: run `runcell setup`"
)]
fn a_plot_shown_with_plt_show_comes_back_as_a_png() {
    let r = run(
        "python",
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('shown only')\nplt.show()\nplt.figure(); plt.bar(['a','b'], [1,2])\n# left open at exit",
        &[],
    );
    r.assert_ok();
    for path in ["figures/figure-1.png", "figures/figure-2.png"] {
        let f = file(&r, path);
        assert_eq!(f["mime_type"], "image/png");
        let png = decode(f["content_base64"].as_str().unwrap());
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{path} is a PNG");
        assert!(png.len() > 2000, "{path} has content");
    }
}

#[test]
#[cfg_attr(
    not(host_python_stack),
    ignore = "needs the Python data stack: run `runcell setup`"
)]
fn a_missing_module_is_an_ordinary_runtime_error_and_pip_cannot_help() {
    let r = run("python", "import requests_oauthlib_unknown", &[]);
    r.assert_category("runtime_error");
    assert!(
        r.message().contains("ModuleNotFoundError"),
        "{}",
        r.message()
    );
    // No pip in the environment: code cannot install packages. `--no-index` keeps even a
    // broken sandbox (pip present, network open) from reaching a package index from a test.
    let r = run(
        "python",
        "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-index', 'six'], capture_output=True, text=True)\nprint(r.returncode != 0, 'No module named pip' in r.stderr)",
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "True True\n");
}

#[test]
#[cfg_attr(
    not(host_python_stack),
    ignore = "needs the Python data stack: run `runcell setup`"
)]
fn the_stack_is_read_only_inside() {
    let r = run(
        "python",
        "import numpy, os\nd = os.path.dirname(numpy.__file__)\ntry:\n    open(os.path.join(d, 'x.py'), 'w')\nexcept OSError as e:\n    print(e.strerror)",
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "Read-only file system\n");
}

#[test]
#[cfg_attr(
    not(all(host_go, host_go_cache)),
    ignore = "needs go and its prepared build cache: run `runcell setup`"
)]
fn go_uses_the_prepared_build_cache() {
    // The prepared standard-library cache is mounted (an overlay) at GOCACHE: the program sees
    // the hundreds of entries `runcell setup` built, and net/http links without compiling
    // the standard library. (How much faster that is, is measured by benches/datastack.sh.)
    let r = run(
        "go",
        "package main\nimport (\"fmt\"; \"net/http\"; \"os\")\nfunc main() {\n\tes, _ := os.ReadDir(os.Getenv(\"GOCACHE\"))\n\tfmt.Println(http.StatusTeapot, len(es) > 200)\n}",
        &["--timeout", "10", "--compile-timeout", "60"],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "418 true\n");
}
