//! `nvmf-perf`: NVMe/TCP load generator, discovery and identify (CONTRACTS.md section 3).
//! Exit status: 0 ok, 1 the run failed, 2 bad arguments.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use nvmf_host::perf::args::{Cli, Command, DiscoverArgs, IdentifyArgs, OutputFormat};
use nvmf_host::perf::info::{discovery_json, discovery_text, IdentifyReport};
use nvmf_host::perf::{self, connect_options, PerfError};
use nvmf_host::{discover, Controller};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = dispatch(cli.command);
    // Which layer made the TLS records (there is no per-connection report to put it in).
    match nvmf_host::tls::record_layers_used() {
        (0, 0) => {}
        (ktls, userspace) => eprintln!("nvmf-perf: TLS records: ktls on {ktls} connection(s), userspace on {userspace}"),
    }
    if let Some(found) = nvmf_host::tls::fallback_found() {
        eprintln!("nvmf-perf: TLS PSK: {found}");
    }
    if let Err(e) = result {
        eprintln!("nvmf-perf: {e}");
        std::process::exit(e.exit_code());
    }
}

fn dispatch(cmd: Command) -> Result<(), PerfError> {
    match cmd {
        Command::Run(a) => {
            // Opened before the run: a path that cannot be written would otherwise lose the
            // whole run's results at its end.
            let output = a.output.as_deref().map(ReportFile::open).transpose()?;
            let (report, error) = match perf::run(&a) {
                Ok(r) => (r, None),
                // JSON carries what was measured and the error (exit 1 still); text only the error.
                Err(PerfError::Midway { error, report }) if a.output_format == OutputFormat::Json => (*report, Some(error)),
                Err(e) => {
                    if let Some(file) = output {
                        file.discard();
                    }
                    return Err(e);
                }
            };
            let text = match a.output_format {
                OutputFormat::Json => {
                    let mut json = report.to_json();
                    if let Some(e) = &error {
                        json["error"] = e.clone().into();
                    }
                    format!("{json:#}\n")
                }
                OutputFormat::Normal => report.to_text(),
            };
            match output {
                Some(file) => file.write(&text)?,
                None => print_out(&text)?,
            }
            error.map_or(Ok(()), |e| Err(PerfError::Failed(e)))
        }
        Command::Discover(a) => discover_cmd(&a),
        Command::Identify(a) => identify_cmd(&a),
    }
}

/// The `--output` file, opened for writing before the run and filled after it.
struct ReportFile {
    path: PathBuf,
    file: std::fs::File,
    created: bool,
}

impl ReportFile {
    fn open(path: &Path) -> Result<ReportFile, PerfError> {
        let created = !path.exists();
        // No truncation yet: a failed run leaves an earlier report as it was.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| PerfError::Usage(format!("--output {}: cannot write there: {e}", path.display())))?;
        Ok(ReportFile { path: path.to_path_buf(), file, created })
    }

    fn write(mut self, text: &str) -> Result<(), PerfError> {
        self.file
            .set_len(0)
            .and_then(|()| self.file.write_all(text.as_bytes()))
            .and_then(|()| self.file.sync_all())
            .map_err(|e| PerfError::Failed(format!("cannot write {}: {e}", self.path.display())))
    }

    /// The run failed: remove the file if this run created it (empty), else leave it alone.
    fn discard(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn print_out(text: &str) -> Result<(), PerfError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(|e| PerfError::Failed(format!("stdout: {e}")))
}

fn discover_cmd(a: &DiscoverArgs) -> Result<(), PerfError> {
    let page = discover(&connect_options(&a.target)?)?;
    match a.output_format {
        OutputFormat::Json => print_out(&format!("{:#}\n", discovery_json(&page))),
        OutputFormat::Normal => print_out(&discovery_text(&page)),
    }
}

fn identify_cmd(a: &IdentifyArgs) -> Result<(), PerfError> {
    let ctrl = Controller::connect(&connect_options(&a.target)?, &a.nqn)?;
    let nsids = match a.nsid {
        Some(n) => vec![n],
        None => ctrl.active_namespaces()?,
    };
    let namespaces = nsids
        .into_iter()
        .map(|n| ctrl.identify_namespace(n).map(|ns| (n, ns)))
        .collect::<Result<Vec<_>, _>>()?;
    let ctrl_raw = ctrl.identify_raw(nvmf_proto::nvme::cns::CONTROLLER, 0)?;
    let ns_raw = namespaces
        .iter()
        .map(|(n, _)| ctrl.identify_raw(nvmf_proto::nvme::cns::NAMESPACE, *n))
        .collect::<Result<Vec<_>, _>>()?;
    let report = IdentifyReport {
        ctrl_raw,
        ns_raw,
        cntlid: ctrl.cntlid(),
        version: ctrl.version(),
        max_transfer: ctrl.max_transfer(),
        ctrl: ctrl.identity().clone(),
        namespaces,
    };
    if let Err(e) = ctrl.shutdown() {
        tracing::warn!("controller shutdown: {e}");
    }
    match a.output_format {
        OutputFormat::Json => print_out(&format!("{:#}\n", report.to_json())),
        OutputFormat::Normal => print_out(&report.to_text()),
    }
}
