fn main() {
    println!("tidegate-engine: not yet");
}
