//! Talks to a guest agent through a VMM's vsock socket:
//! `cargo run -p forkvm-proto --example agent_call -- /path/v.sock uname -r`.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let client = forkvm_proto::AgentClient::vsock_uds(&args[0], 1024);
    let t = std::time::Instant::now();
    println!("ping: {:?} in {:?}", client.ping(), t.elapsed());
    let t = std::time::Instant::now();
    let out = client.exec_collect(&forkvm_proto::ExecRequest::argv(args[1..].to_vec()), b"");
    match out {
        Ok(o) => println!(
            "exec in {:?}: {:?} stdout={:?} stderr={:?}",
            t.elapsed(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => println!("exec error: {e}"),
    }
}
