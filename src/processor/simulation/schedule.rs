//! The schedule: what happens to the world, drawn from the seed up front.

use super::*;

#[derive(Debug, Clone)]
pub(super) enum Action {
    Produce {
        partition: i32,
        entries: usize,
    },
    Kill(usize),
    Restart(usize),
    Freeze(usize),
    Thaw(usize),
    /// Wait until the world caught up and check the state; then maybe retention.
    Quiet {
        retention: Option<(i32, u64)>,
    },
}

/// Everything a seed decides up front.
pub(super) struct Schedule {
    pub(super) partitions: i32,
    pub(super) replicas: usize,
    pub(super) cooperative: bool,
    pub(super) batch_max_records: usize,
    pub(super) linger_ms: u64,
    /// (delay before, action).
    pub(super) steps: Vec<(Duration, Action)>,
}

impl Schedule {
    pub(super) fn draw(rng: &mut ChaCha8Rng) -> Schedule {
        let partitions = rng.random_range(1..=3);
        let replicas = rng.random_range(1..=3);
        let mut steps = Vec::new();
        let n = rng.random_range(6..=16);
        let mut frozen: Vec<(usize, usize)> = Vec::new(); // (replica, thaw at step)
        for i in 0..n {
            let delay = Duration::from_millis(rng.random_range(0..1500));
            let action = match rng.random_range(0..100) {
                0..=54 => {
                    Action::Produce { partition: rng.random_range(0..partitions), entries: rng.random_range(1..=16) }
                }
                55..=64 => Action::Kill(rng.random_range(0..replicas)),
                65..=74 => Action::Restart(rng.random_range(0..replicas)),
                75..=84 => {
                    let r = rng.random_range(0..replicas);
                    frozen.push((r, i + rng.random_range(1..=4)));
                    Action::Freeze(r)
                }
                _ => Action::Quiet {
                    retention: rng
                        .random_bool(0.5)
                        .then(|| (rng.random_range(0..partitions), rng.random_range(0..=u64::from(u32::MAX)))),
                },
            };
            steps.push((delay, action));
            // A frozen replica is woken some steps later, after a delay that is shorter or
            // longer than the session timeout.
            for (r, _) in frozen.iter().filter(|(_, at)| *at == i) {
                let d = Duration::from_millis(rng.random_range(0..2 * SESSION_TIMEOUT.as_millis() as u64));
                steps.push((d, Action::Thaw(*r)));
            }
            frozen.retain(|(_, at)| *at != i);
        }
        for (r, _) in frozen {
            steps.push((Duration::from_millis(rng.random_range(0..15_000)), Action::Thaw(r)));
        }
        steps.push((Duration::ZERO, Action::Quiet { retention: None }));
        Schedule {
            partitions,
            replicas,
            cooperative: rng.random_bool(0.5),
            batch_max_records: rng.random_range(1..=40),
            linger_ms: rng.random_range(0..=20),
            steps,
        }
    }
}
