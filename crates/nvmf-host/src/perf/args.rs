//! Command line of `nvmf-perf` (CONTRACTS.md section 3): nvme-cli style addressing, fio style
//! workload options. clap rejects malformed values with exit status 2; checks that need the
//! namespace (block size, capacity) happen in [`super::plan`] and exit 2 as well.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::workload::RwMode;

#[derive(Debug, Parser)]
#[command(name = "nvmf-perf", version, about = "NVMe/TCP load generator, discovery and identify")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing would buy nothing
pub enum Command {
    /// Run a workload against an NVMe/TCP namespace or, with --local, a local file or device.
    Run(RunArgs),
    /// Read the discovery log page and print one block per entry, like `nvme discover`.
    Discover(DiscoverArgs),
    /// Print the Identify Controller and Identify Namespace data.
    Identify(IdentifyArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Completion {
    /// Non-blocking socket, the job thread spins on it (like polled queues).
    Poll,
    /// The job thread sleeps in the kernel until the socket is readable.
    Event,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Normal,
    Json,
}

/// Where the controller is and how to connect to it (names as nvme-cli spells them).
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Transport type: tcp, or rdma in a build with the `rdma` feature.
    #[arg(short = 't', long = "transport", default_value = "tcp", value_parser = ["tcp", "rdma"])]
    pub transport: String,
    /// Target address (IP or host name).
    #[arg(short = 'a', long = "traddr")]
    pub traddr: Option<String>,
    /// Target port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    pub trsvcid: u16,
    /// Host NQN (default: /etc/nvme/hostnqn, else nqn.2014-08.org.nvmexpress:uuid:<uuid>).
    #[arg(short = 'q', long = "hostnqn")]
    pub hostnqn: Option<String>,
    /// Ask for the CRC32C header digest.
    #[arg(long = "hdr_digest")]
    pub hdr_digest: bool,
    /// Ask for the CRC32C data digest.
    #[arg(long = "data_digest")]
    pub data_digest: bool,
    /// Keep Alive Timeout in seconds (0 disables keep alive).
    #[arg(long = "kato", default_value_t = 5)]
    pub kato: u32,
    /// SO_PRIORITY of every socket.
    #[arg(long = "so_priority")]
    pub so_priority: Option<u32>,
    /// IP type of service (IP_TOS / IPV6_TCLASS) of every socket.
    #[arg(long = "tos")]
    pub tos: Option<u32>,
    /// SO_BUSY_POLL in microseconds on every socket.
    #[arg(long = "busy_poll_us")]
    pub busy_poll_us: Option<u32>,
    /// TCP congestion control of every socket (TCP_CONGESTION, e.g. cubic); default: the
    /// system's (net.ipv4.tcp_congestion_control).
    #[arg(long = "tcp_congestion", value_parser = parse_congestion_name)]
    pub tcp_congestion: Option<String>,
    /// Ask the controller to disable SQ flow control (Connect CATTR bit 2): one that grants it may
    /// end each read with its last C2HData PDU instead of a separate response.
    #[arg(long = "disable-sqflow")]
    pub disable_sqflow: bool,
    /// DH-HMAC-CHAP secret of the host (`DHHC-1:XX:...:`, as `nvme gen-dhchap-key` prints it).
    #[arg(short = 'S', long = "dhchap-secret")]
    pub dhchap_secret: Option<String>,
    /// DH-HMAC-CHAP secret of the controller: the host also authenticates the controller.
    #[arg(short = 'C', long = "dhchap-ctrl-secret")]
    pub dhchap_ctrl_secret: Option<String>,
    /// Secure the connections with TLS 1.3 (a PSK from --tls-key; the handshake comes before ICReq).
    #[arg(long = "tls")]
    pub tls: bool,
    /// TLS PSK in the interchange format (`NVMeTLSkey-1:HH:<base64>:`, as `nvme gen-tls-key`
    /// prints it); implies --tls.
    #[arg(long = "tls-key")]
    pub tls_key: Option<String>,
    /// PSK identity to offer: `NVMe0R01 <hostnqn> <subnqn>` or `NVMe1R01 ... <digest>` (its
    /// version is used; the identity is derived per connection), or just 0 or 1 (default 1).
    #[arg(long = "tls-key-identity")]
    pub tls_key_identity: Option<String>,
    /// Derive the TLS PSK the way libnvme before 1.16 does (nvme-cli's `--compat`; what Debian
    /// trixie's nvme-cli 2.13 inserts into the keyring), for a kernel target holding such keys.
    #[arg(long = "tls-compat")]
    pub tls_compat: bool,
    /// TLS records in the kernel (kTLS): auto (when the socket takes the TLS ULP, else
    /// userspace), on (fail without it), off. Needs --tls-key.
    #[arg(long = "ktls")]
    pub ktls: Option<String>,
}

impl TargetArgs {
    /// The report's engine: the fabric the run used (its text header and `nvmflab.engine`).
    pub fn engine(&self) -> &'static str {
        if self.transport == "rdma" {
            "rdma"
        } else {
            "tcp"
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Subsystem NQN.
    #[arg(short = 'n', long = "nqn")]
    pub nqn: Option<String>,
    /// Namespace ID.
    #[arg(long = "nsid", default_value_t = 1)]
    pub nsid: u32,
    /// Run against a local file or block device through io_uring instead of NVMe/TCP.
    #[arg(long = "local", conflicts_with_all = ["traddr", "nqn"])]
    pub local: Option<PathBuf>,
    /// read, write, randread, randwrite, rw or randrw.
    #[arg(long = "rw", default_value = "randread")]
    pub rw: RwMode,
    /// Percentage of reads in rw/randrw.
    #[arg(long = "rwmixread", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,
    /// Block size of each I/O (512, 4k, 128k, 1m, ...).
    #[arg(long = "bs", default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// I/Os in flight per job.
    #[arg(long = "iodepth", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub iodepth: u32,
    /// Jobs, each with its own I/O queue and thread.
    #[arg(long = "numjobs", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub numjobs: u32,
    /// Measured duration (10, 10s, 500ms, 2m); without it each job makes one pass over its region.
    #[arg(long = "runtime", value_parser = parse_duration)]
    pub runtime: Option<Duration>,
    /// Warm-up before measuring, not counted.
    #[arg(long = "ramp_time", default_value = "0", value_parser = parse_duration)]
    pub ramp_time: Duration,
    /// IOPS limit per job.
    #[arg(long = "rate_iops", value_parser = clap::value_parser!(u64).range(1..))]
    pub rate_iops: Option<u64>,
    /// CPUs for the job threads, job i on the i-th (round robin), e.g. 0-3 or 0,2.
    #[arg(long = "cpus_allowed")]
    pub cpus_allowed: Option<super::cpu::CpuList>,
    /// Bytes of the namespace to use from --offset (default: the rest of it).
    #[arg(long = "size", value_parser = parse_size)]
    pub size: Option<u64>,
    /// First byte of the region.
    #[arg(long = "offset", default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// How a job waits for completions.
    #[arg(long = "completion", value_enum, default_value_t = Completion::Event)]
    pub completion: Completion,
    /// Measure connects instead of I/O: each operation connects a controller with one I/O queue
    /// (TCP, TLS, ICReq, Fabrics Connect, DH-HMAC-CHAP), timed until the queue is ready, then
    /// disconnects it; latency is the connect time (`perf/connects.rs`).
    #[arg(long = "connects", conflicts_with = "local")]
    pub connects: bool,
    /// Write self-checking patterns and read them back (write workloads), or check every block
    /// read carries a valid pattern for its LBA (read workloads).
    #[arg(long = "verify")]
    pub verify: bool,
    /// Per-interval IOPS and latency percentiles every N ms in the JSON report
    /// (`nvmflab.intervals`, like fio's log_avg_msec logs); 0 turns them off.
    #[arg(long = "log_avg_msec", default_value_t = 1000)]
    pub log_avg_msec: u64,
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = OutputFormat::Normal)]
    pub output_format: OutputFormat,
    /// Write the report to FILE instead of stdout.
    #[arg(long = "output")]
    pub output: Option<PathBuf>,
    /// Seconds between reconnect attempts after a lost connection (nvme-cli's option; 1, 0.5,
    /// 200ms). The first attempt comes this long after the loss.
    #[arg(long = "reconnect-delay", alias = "reconnect_delay", default_value = "1", value_parser = parse_duration)]
    pub reconnect_delay: Duration,
    /// Seconds after a lost connection before giving up and failing the run (nvme-cli's option;
    /// -1 = retry forever, 0 = no reconnect).
    #[arg(long = "ctrl-loss-tmo", alias = "ctrl_loss_tmo", default_value = "10", value_parser = parse_loss_tmo, allow_hyphen_values = true)]
    pub ctrl_loss_tmo: LossTimeout,    /// Start the first I/O at this wall-clock moment (Unix epoch seconds), after connecting:
    /// a start barrier for several hosts (perf/start_at.rs).
    #[arg(long = "start-at", value_parser = super::start_at::parse)]
    pub start_at: Option<super::start_at::StartAt>,
}

/// `--ctrl-loss-tmo`: a duration, or -1 for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossTimeout(pub Option<Duration>);

fn parse_loss_tmo(s: &str) -> Result<LossTimeout, String> {
    match s.trim() {
        "-1" => Ok(LossTimeout(None)),
        t if t.starts_with('-') => Err(format!("invalid --ctrl-loss-tmo {s:?}: -1 (forever) or a duration")),
        t => parse_duration(t).map(|d| LossTimeout(Some(d))),
    }
}

#[derive(Debug, Clone, Args)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = OutputFormat::Normal)]
    pub output_format: OutputFormat,
}

#[derive(Debug, Clone, Args)]
pub struct IdentifyArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Subsystem NQN.
    #[arg(short = 'n', long = "nqn")]
    pub nqn: String,
    /// Namespace to identify (default: every active namespace).
    #[arg(long = "nsid")]
    pub nsid: Option<u32>,
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = OutputFormat::Normal)]
    pub output_format: OutputFormat,
}

/// Parses a byte count: `512`, `4k`, `128K`, `1m`, `64MiB`, `1GiB`, `2t` (`nvmf_proto::units`,
/// as the target parses its sizes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    nvmf_proto::units::parse_size(s).map_err(|e| format!("invalid size {s:?}: {e}"))
}

/// Parses a duration: plain seconds (`10`, `0.5`) or with a unit (`500ms`, `10s`, `2m`, `1h`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}: expected seconds (10) or 500ms, 10s, 2m"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "us" => n / 1_000_000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}"))
}

/// Checks a TCP congestion control name (`cubic`, `bbr`, ...): what the kernel takes is up to
/// 15 bytes; whether this machine has it is known only when a socket is set.
pub fn parse_congestion_name(s: &str) -> Result<String, String> {
    if nvmf_proto::congestion::is_congestion_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!("invalid congestion control {s:?}: a kernel name such as cubic or bbr (1-15 of a-z, 0-9, _)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_powers_of_1024() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128k"), Ok(128 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(parse_size("").unwrap_err().contains("expected a number"));
        assert!(parse_size("k").unwrap_err().contains("expected a number"));
        assert!(parse_size("4x").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-4k").is_err());
        assert!(parse_size("99999999999999999999").unwrap_err().contains("too large"));
        assert!(parse_size("16777216t").unwrap_err().contains("too large"));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("nvmf-perf").chain(args.iter().copied()))
    }

    #[test]
    fn a_full_run_command_line_parses() {
        let cli = parse(&[
            "run", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420", "-n", "nqn.x", "--rw", "randrw",
            "--rwmixread", "70", "--bs", "128k", "--iodepth", "32", "--numjobs", "2", "--runtime", "5",
            "--ramp_time", "1", "--rate_iops", "1000", "--cpus_allowed", "0-1", "--size", "1GiB",
            "--offset", "1m", "--completion", "poll", "--hdr_digest", "--data_digest", "--verify",
            "--so_priority", "6", "--tos", "16", "--busy_poll_us", "50", "--output-format", "json",
            "--output", "/tmp/x.json",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else { panic!("not run") };
        assert_eq!(r.rw, RwMode::RandRw);
        assert_eq!(r.bs, 128 << 10);
        assert_eq!(r.iodepth, 32);
        assert_eq!(r.cpus_allowed.unwrap().0, vec![0, 1]);
        assert_eq!(r.completion, Completion::Poll);
        assert!(r.target.hdr_digest && r.target.data_digest && r.verify);
        assert_eq!(r.output_format, OutputFormat::Json);
        assert_eq!(r.size, Some(1 << 30));
    }

    #[test]
    fn the_report_engine_names_the_transport() {
        let engine = |t: &[&str]| {
            let Command::Run(r) = parse(&[&["run", "-a", "10.0.0.1", "-n", "nqn.x"], t].concat()).unwrap().command else {
                panic!("not run")
            };
            r.target.engine()
        };
        assert_eq!(engine(&[]), "tcp");
        assert_eq!(engine(&["-t", "rdma"]), "rdma", "an RDMA run was reported as tcp");
    }

    #[test]
    fn reconnect_options_take_nvme_cli_names_and_minus_one() {
        let run = |extra: &[&str]| {
            let mut a = vec!["run", "--local", "/tmp/f"];
            a.extend_from_slice(extra);
            match parse(&a).unwrap().command {
                Command::Run(r) => r,
                _ => unreachable!("parsed a run command"),
            }
        };
        let r = run(&[]);
        assert_eq!((r.reconnect_delay, r.ctrl_loss_tmo), (Duration::from_secs(1), LossTimeout(Some(Duration::from_secs(10)))));
        let r = run(&["--reconnect-delay", "200ms", "--ctrl-loss-tmo", "-1"]);
        assert_eq!((r.reconnect_delay, r.ctrl_loss_tmo), (Duration::from_millis(200), LossTimeout(None)));
        let r = run(&["--reconnect_delay", "2", "--ctrl_loss_tmo=0"]);
        assert_eq!((r.reconnect_delay, r.ctrl_loss_tmo), (Duration::from_secs(2), LossTimeout(Some(Duration::ZERO))));
        let e = parse(&["run", "--local", "/tmp/f", "--ctrl-loss-tmo", "-5"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("-1 (forever)"), "{e}");
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        use clap::error::ErrorKind;
        for (args, needle) in [
            (&["run", "--local", "/tmp/f", "--iodepth", "0"][..], "iodepth"),
            (&["run", "--local", "/tmp/f", "--rw", "sideways"], "unknown rw"),
            (&["run", "--local", "/tmp/f", "--bs", "4q"], "unknown unit"),
            (&["run", "--local", "/tmp/f", "--rwmixread", "101"], "rwmixread"),
            (&["run", "-t", "fc", "-a", "x"], "fc"),
            (&["run", "--local", "/tmp/f", "--cpus_allowed", "x"], "CPU list"),
            (&["run", "--local", "/tmp/f", "--completion", "spin"], "spin"),
            (&["identify", "-a", "127.0.0.1"], "--nqn"),
        ] {
            let e = parse(args).unwrap_err();
            assert_ne!(e.kind(), ErrorKind::DisplayHelp);
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(needle), "{args:?}: {e}");
        }
    }
}
