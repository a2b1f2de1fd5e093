//! The oracle's plan: dynamic programming over (decision bucket, replica count, backlog) on
//! the fluid picture, minimising replica-seconds plus the rebalance cost of every change
//! while the oldest event never gets older than the limit.

use std::cmp::Ordering;

use super::super::scenario::Model;
use super::super::schedule::Schedule;
use super::super::static_reference::{replica_cap, replica_floor};
use super::fluid::{Change, Fluid, advance, group_speed};

/// Backlog levels per (bucket, count): each keeps its cheapest state, with that state's exact
/// backlog, so a plan is never rounded into something the fluid model would not do.
const BACKLOG_LEVELS: usize = 48;

const NO_PARENT: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Cell {
    cost: f64,
    backlog: f64,
    parent: usize,
}

const UNREACHED: Cell = Cell {
    cost: f64::INFINITY,
    backlog: 0.0,
    parent: NO_PARENT,
};

/// The grid of cells, layer by layer (one layer per bucket start and one for the end).
struct Grid {
    floor: u32,
    counts: usize,
    cells: Vec<Cell>,
}

impl Grid {
    fn index(&self, bucket: usize, count: u32, level: usize) -> usize {
        (bucket * self.counts + (count - self.floor) as usize) * BACKLOG_LEVELS + level
    }

    /// (bucket, count) of a cell index.
    fn locate(&self, index: usize) -> (usize, u32) {
        let slot = index / BACKLOG_LEVELS;
        (slot / self.counts, self.floor + (slot % self.counts) as u32)
    }

    /// Keeps the candidate if it is the cheapest in its cell (the smaller backlog on a tie).
    fn relax(&mut self, index: usize, candidate: Cell) {
        let cell = &mut self.cells[index];
        let better = candidate.cost < cell.cost
            || (candidate.cost == cell.cost && candidate.backlog < cell.backlog);
        if better {
            *cell = candidate;
        }
    }
}

fn level(backlog: f64, window: f64) -> usize {
    if window <= 0.0 {
        return 0;
    }
    ((backlog / window * BACKLOG_LEVELS as f64).floor() as usize).min(BACKLOG_LEVELS - 1)
}

/// The cheapest schedule the fluid model says keeps every event younger than `limit`
/// seconds, with one count per bucket of `bucket_seconds`; `None` when none does.
pub(super) fn plan(model: &Model, bucket_seconds: f64, limit: f64) -> Option<Schedule> {
    let fluid = Fluid::new(model, bucket_seconds, limit);
    let (floor, cap) = (replica_floor(model), replica_cap(model));
    let speeds: Vec<f64> = (floor..=cap)
        .map(|count| group_speed(&model.partition_shares, count))
        .collect();
    let counts = speeds.len();
    let mut grid = Grid {
        floor,
        counts,
        cells: vec![UNREACHED; (fluid.buckets + 1) * counts * BACKLOG_LEVELS],
    };
    // The run starts with the first count ready and nothing queued.
    for count in floor..=cap {
        let index = grid.index(0, count, 0);
        grid.cells[index] = Cell {
            cost: 0.0,
            backlog: 0.0,
            parent: NO_PARENT,
        };
    }
    let rebalance_cost = model.budget.rebalance_cost_seconds;
    for bucket in 0..fluid.buckets {
        let [keep, up, down] =
            [Change::Keep, Change::Up, Change::Down].map(|c| fluid.edge(bucket, c));
        for count in floor..=cap {
            let old_speed = speeds[(count - floor) as usize];
            for level_from in 0..BACKLOG_LEVELS {
                let from_index = grid.index(bucket, count, level_from);
                let from = grid.cells[from_index];
                if from.cost.is_infinite() {
                    continue;
                }
                for next in floor..=cap {
                    let edge = match next.cmp(&count) {
                        Ordering::Equal => &keep,
                        Ordering::Greater => &up,
                        Ordering::Less => &down,
                    };
                    let new_speed = speeds[(next - floor) as usize];
                    let Some(backlog) = advance(&edge.substeps, from.backlog, old_speed, new_speed)
                    else {
                        continue;
                    };
                    let change_cost = if next == count {
                        0.0
                    } else {
                        rebalance_cost * f64::from(next)
                    };
                    let to_level = level(backlog, fluid.bucket_window(edge.landing));
                    let to_index = grid.index(edge.landing, next, to_level);
                    grid.relax(
                        to_index,
                        Cell {
                            cost: from.cost + f64::from(next) * edge.seconds + change_cost,
                            backlog,
                            parent: from_index,
                        },
                    );
                }
            }
        }
    }
    // The run must end as it began, with nothing more waiting than a bucket's arrivals: a
    // schedule that leaves a backlog for after the run borrows replicas it never pays for
    // (on a constant load it would undercut the count that keeps up). Only where no schedule
    // can end drained (an undrainable load) is the cheapest of all taken.
    let last_layer = grid.index(fluid.buckets, floor, 0)..grid.cells.len();
    let settled = model.production_rate(model.duration) * bucket_seconds;
    let cheapest = |drained_only: bool| {
        last_layer
            .clone()
            .filter(|&index| grid.cells[index].cost.is_finite())
            .filter(|&index| !drained_only || grid.cells[index].backlog <= settled)
            .min_by(|&a, &b| grid.cells[a].cost.total_cmp(&grid.cells[b].cost))
    };
    let best = cheapest(true).or_else(|| cheapest(false))?;
    Some(schedule_to(&grid, best, fluid.buckets, bucket_seconds))
}

/// Walks the parents back from the best final cell: each edge sets its count from the bucket
/// it starts in up to the one it lands in.
fn schedule_to(grid: &Grid, best: usize, buckets: usize, bucket_seconds: f64) -> Schedule {
    let mut counts = vec![0; buckets];
    let mut index = best;
    while grid.cells[index].parent != NO_PARENT {
        let parent = grid.cells[index].parent;
        let (landing, count) = grid.locate(index);
        let (start, _) = grid.locate(parent);
        counts[start..landing].fill(count);
        index = parent;
    }
    Schedule {
        bucket_seconds,
        counts,
    }
}
