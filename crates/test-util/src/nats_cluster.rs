//! A NATS cluster of three (or more) nats-servers with JetStream on this machine, started for one
//! test: free client and route ports, a temp store each, every server routed to the others. A
//! member can be killed (SIGKILL) and started again on the same ports and store, as a crashed
//! server and its supervisor would.

use std::time::Duration;

use anyhow::Context;
use chronoshard_natsd::{free_port, ClusterOptions, Options, Server};

/// The servers of a NATS cluster.
#[derive(Debug)]
pub struct NatsCluster {
    servers: Vec<Option<Server>>,
    options: Vec<Options>,
    binary: chronoshard_natsd::Binary,
    _dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `n` servers and waits until JetStream answers on every one.
    pub async fn start(n: usize) -> anyhow::Result<NatsCluster> {
        let dir = tempfile::tempdir()?;
        let binary = chronoshard_natsd::find()?;
        let route_ports: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_, _>>()?;
        let mut options = Vec::new();
        for i in 0..n {
            let mut o = Options::in_dir(&dir.path().join(format!("n{i}")));
            o.port = free_port()?;
            o.cluster = Some(ClusterOptions {
                name: "chronoshard-test".into(),
                server_name: format!("n{i}"),
                route_port: route_ports[i],
                routes: route_ports
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, p)| *p)
                    .collect(),
            });
            options.push(o);
        }
        let starts = options.iter().map(|o| Server::start(binary.clone(), o));
        let servers = futures::future::try_join_all(starts)
            .await
            .context("starting the NATS cluster")?;
        let cluster = NatsCluster {
            servers: servers.into_iter().map(Some).collect(),
            options,
            binary,
            _dir: dir,
        };
        for i in 0..n {
            cluster.wait_jetstream(i).await?;
        }
        Ok(cluster)
    }

    /// `nats://127.0.0.1:a,nats://127.0.0.1:b,...`: every member, as clients are given it.
    pub fn url(&self) -> String {
        self.options
            .iter()
            .map(|o| format!("nats://127.0.0.1:{}", o.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// One member's URL.
    pub fn member_url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.options[i].port)
    }

    pub fn len(&self) -> usize {
        self.options.len()
    }

    pub fn is_empty(&self) -> bool {
        self.options.is_empty()
    }

    /// Kills member `i` at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut s) = self.servers[i].take() {
            s.kill().await?;
        }
        Ok(())
    }

    /// Starts member `i` again on its ports and store, and waits until its JetStream answers.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.servers[i].is_none(), "member {i} is running");
        let s = Server::start(self.binary.clone(), &self.options[i]).await?;
        self.servers[i] = Some(s);
        self.wait_jetstream(i).await
    }

    /// The last `lines` lines of member `i`'s log, leaving out its attempts to reach a member
    /// that is down (one a second per route connection).
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.options[i].log_file).unwrap_or_default();
        let all: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("Error trying to connect to route"))
            .collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until member `i` answers JetStream requests (the cluster has a meta leader).
    async fn wait_jetstream(&self, i: usize) -> anyhow::Result<()> {
        let client = async_nats::connect(self.member_url(i)).await?;
        let js = async_nats::jetstream::new(client);
        crate::wait_for(
            &format!("JetStream on member {i}"),
            Duration::from_secs(30),
            || async { js.query_account().await.ok() },
        )
        .await?;
        Ok(())
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.options.len() {
                eprintln!(
                    "--- last lines of nats-server n{i} ---\n{}",
                    self.log_tail(i, 40)
                );
            }
        }
    }
}
