//! Discovery: connect to the well-known discovery NQN, read the log page header to learn
//! NUMREC, then read every entry, like `nvme discover`.

use nvmf_proto::discovery::{DiscoveryLogPage, ENTRY_LEN, HEADER_LEN};
use nvmf_proto::fabrics::DISCOVERY_NQN;
use nvmf_proto::nvme::log_page;

use crate::connection::{ConnectOptions, Link};
use crate::controller::Controller;
use crate::error::{Error, Result};

/// More records than any real discovery controller has; bounds what a hostile one can make us read.
const MAX_RECORDS: u64 = 4096;

/// Reads the discovery log page of the discovery controller at `opts.addr`.
pub fn discover(opts: &ConnectOptions) -> Result<DiscoveryLogPage> {
    read_and_shut_down(Controller::connect(opts, DISCOVERY_NQN)?)
}

/// [`discover`] over `link` instead of a TCP connection to `opts.addr`.
pub fn discover_over(link: Box<dyn Link>, opts: &ConnectOptions) -> Result<DiscoveryLogPage> {
    read_and_shut_down(Controller::connect_over(link, opts, DISCOVERY_NQN)?)
}

fn read_and_shut_down(ctrl: Controller) -> Result<DiscoveryLogPage> {
    let page = read_log(&ctrl)?;
    ctrl.shutdown()?;
    Ok(page)
}

fn read_log(ctrl: &Controller) -> Result<DiscoveryLogPage> {
    // GENCTR changes if the page changes while we read it: read again (a few times at most).
    for _ in 0..4 {
        let header = ctrl.get_log_page(log_page::DISCOVERY, 0, HEADER_LEN)?;
        let numrec = DiscoveryLogPage::numrec(&header).map_err(|e| Error::decode("discovery log header", e))?;
        if numrec > MAX_RECORDS {
            return Err(Error::decode("discovery log header", format!("NUMREC {numrec} exceeds {MAX_RECORDS}")));
        }
        let all = ctrl.get_log_page(log_page::DISCOVERY, 0, HEADER_LEN + numrec as usize * ENTRY_LEN)?;
        let page = DiscoveryLogPage::decode(&all).map_err(|e| Error::decode("discovery log page", e))?;
        if all[..8] == header[..8] {
            return Ok(page);
        }
    }
    Err(Error::Protocol("the discovery log page kept changing (GENCTR) while it was read".into()))
}
