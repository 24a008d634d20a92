//! Where the process touches the real operating system's time and sockets: the system clock,
//! tokio timers and the tokio spawner behind the `Clock` and `Spawner` ports (`clock`), and
//! bounded accepting on real listeners for both ports (`accept`). These are the two modules
//! allowed past the clippy.toml bans on raw time and spawning; everything else asks the ports.

pub mod accept;
mod clock;

pub use clock::{Stopwatch, SystemClock, TokioSpawner};
