//! Development helper: `show TARGET FILE` prints the decoded input and runs it.
fn main() {
    let target = std::env::args().nth(1).expect("target");
    let path = std::env::args().nth(2).expect("file");
    let data = std::fs::read(path).expect("read");
    match target.as_str() {
        "client_ops" => {
            let i = leasehold_fuzz::decode::<leasehold_fuzz::client_ops::Input>(&data);
            println!("{i:#?}");
        }
        "ffi" => {
            let i = leasehold_fuzz::decode::<leasehold_fuzz::ffi_ops::Input>(&data);
            println!("{i:#?}");
        }
        "resp" => {
            let i = leasehold_fuzz::decode::<leasehold_fuzz::resp_ops::Input>(&data);
            println!("{i:#?}");
        }
        _ => {
            let i = leasehold_fuzz::decode::<leasehold_fuzz::sim_ops::Input>(&data);
            println!("{i:#?}");
        }
    }
    leasehold_fuzz::run_target(&target, &data);
}
