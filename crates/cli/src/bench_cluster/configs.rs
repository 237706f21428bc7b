//! The configurations of `tcps bench cluster`: which program, on which
//! network, compared with which baseline.

use serde::Serialize;

use super::args::Error;

/// Where the application's sockets are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Net {
    /// Kernel sockets on the application node.
    Kernel,
    /// A TCP server on the application node (shared memory).
    Local,
    /// The TCP server on the server node (UCX).
    Remote,
    /// TCP servers on two server nodes (UCX, `TCPS_REMOTE=S1,S2`): the
    /// host's listeners on both, its new sockets spread over them.
    Remote2,
}

impl Net {
    /// The TCP servers of a configuration (the first on the application
    /// node for `Local`, on the server nodes otherwise).
    pub fn servers(self) -> usize {
        match self {
            Net::Kernel => 0,
            Net::Local | Net::Remote => 1,
            Net::Remote2 => 2,
        }
    }

    /// Its sockets are served over the fabric.
    pub fn remote(self) -> bool {
        matches!(self, Net::Remote | Net::Remote2)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum App {
    /// The example web server (`examples/webserver`).
    Web,
    /// The unmodified nginx (through `tcps run` when offloaded).
    Nginx,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Config {
    pub id: &'static str,
    pub label: &'static str,
    pub app: App,
    pub net: Net,
}

impl Config {
    /// The configuration its throughput is compared with.
    pub fn baseline(&self) -> &'static str {
        match self.app {
            App::Web => "regular",
            App::Nginx => "nginx",
        }
    }
}

pub const ALL: [Config; 7] = [
    Config {
        id: "regular",
        label: "Regular (kernel sockets)",
        app: App::Web,
        net: Net::Kernel,
    },
    Config {
        id: "local",
        label: "local tcps (shared memory)",
        app: App::Web,
        net: Net::Local,
    },
    Config {
        id: "remote",
        label: "remote tcps (UCX)",
        app: App::Web,
        net: Net::Remote,
    },
    Config {
        id: "nginx",
        label: "nginx (kernel sockets)",
        app: App::Nginx,
        net: Net::Kernel,
    },
    Config {
        id: "nginx-local",
        label: "nginx, tcps run (local)",
        app: App::Nginx,
        net: Net::Local,
    },
    Config {
        id: "nginx-remote",
        label: "nginx, tcps run --remote",
        app: App::Nginx,
        net: Net::Remote,
    },
    Config {
        id: "nginx-remote2",
        label: "nginx, tcps run --remote S1,S2",
        app: App::Nginx,
        net: Net::Remote2,
    },
];

/// Some configuration needs the second TCP-server node.
pub fn two_servers(configs: &[Config]) -> bool {
    configs.iter().any(|c| c.net.servers() == 2)
}

/// `--configs` (ids; empty: all, the nginx ones if `nginx` is installed),
/// each with its baseline (added first if not asked for).
pub fn select(wanted: &[String], nginx: bool, workload: &str) -> Result<Vec<Config>, Error> {
    for w in wanted {
        if !ALL.iter().any(|c| c.id == w) {
            let ids: Vec<&str> = ALL.iter().map(|c| c.id).collect();
            return Err(format!("unknown configuration '{w}' (known: {})", ids.join(", ")).into());
        }
    }
    let asked = |c: &Config| {
        if wanted.is_empty() {
            nginx || c.app == App::Web
        } else {
            let base_of = |w: &String| ALL.iter().any(|x| x.id == w && x.baseline() == c.id);
            wanted.iter().any(|w| w == c.id || base_of(w))
        }
    };
    let picked: Vec<Config> = ALL.iter().copied().filter(asked).collect();
    if let Some(c) = picked.iter().find(|c| c.app == App::Nginx) {
        if !nginx {
            return Err(format!(
                "{}: nginx is not installed (apt-get install nginx-light)",
                c.id
            )
            .into());
        }
        if workload == "combined" {
            return Err(
                "nginx serves no /dynamic/N: the combined workload is the web server's only".into(),
            );
        }
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_come_along() {
        let ids = |v: Vec<Config>| v.iter().map(|c| c.id).collect::<Vec<_>>();
        let all = select(&[], true, "static-16k").unwrap();
        assert_eq!(all.len(), 7);
        assert!(two_servers(&all));
        assert_eq!(
            ids(select(&[], false, "static-16k").unwrap()),
            ["regular", "local", "remote"]
        );
        let w = vec!["remote".to_string(), "nginx-remote".to_string()];
        assert_eq!(
            ids(select(&w, true, "static-16k").unwrap()),
            ["regular", "remote", "nginx", "nginx-remote"]
        );
        assert!(select(&w, false, "static-16k").is_err());
        assert!(!two_servers(&select(&w, true, "static-16k").unwrap()));
        let two = select(&["nginx-remote2".to_string()], true, "static-16k").unwrap();
        assert_eq!(ids(two.clone()), ["nginx", "nginx-remote2"]);
        assert_eq!(two[1].baseline(), "nginx");
        assert!(two_servers(&two));
        assert!(select(&w, true, "combined").is_err());
        assert!(select(&["x".to_string()], true, "static-16k").is_err());
    }
}
