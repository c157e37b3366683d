//! High-quality jobs (SPEC section 4): every configured seat reads one
//! moment. The job id (at most [`crate::ids::JOB_ID_MAX_BYTES`], checked
//! here for every caller) derives its turns' request ids `<job id>:<index>`.

use super::{answer, known_request, live, mint_new, refuse, turn_start, Decision, Plan};
use crate::command::StartJob;
use crate::error::{Conflict, EngineError};
use crate::ids::{check_job_id, job_turn_request_id, Id};
use crate::mirror::Mirror;
use crate::op::{JobStart, OpBody, OpKind, TurnMode};
use crate::outcome::{Outcome, Replay};

/// `job.start` with one turn per seat: each part is written unless it
/// already is, so a retry completes a torn batch.
pub fn decide_job(mirror: &Mirror, c: StartJob, mint: &mut dyn FnMut() -> Id) -> Decision {
    if let Err(e) = check_job_id(&c.job_id) {
        return refuse(e.into());
    }
    let mut ops = Vec::new();
    let (moment_id, seats) = match mirror.jobs.get(&c.job_id) {
        Some(job) if job.moment_id != c.moment_id => {
            return refuse(
                Conflict::JobMoment {
                    job_id: c.job_id,
                    moment_id: job.moment_id,
                }
                .into(),
            )
        }
        Some(job) => (job.moment_id, job.seats.clone()),
        None => match new_job(mirror, &c) {
            Err(e) => return refuse(e),
            Ok(op) => {
                ops.push(op);
                (c.moment_id, c.seats.clone())
            }
        },
    };
    if let Err(e) = push_missing_turns(mirror, &c, moment_id, &seats, mint, &mut ops) {
        return refuse(e);
    }
    if ops.is_empty() {
        return match mirror.jobs.get(&c.job_id) {
            Some(job) => answer(Outcome::JobStarted {
                created: false,
                replayed: Some(Replay::of(mirror, job.seq, job.ts_ms)),
                job: mirror.job_view(job),
            }),
            None => refuse(EngineError::Missing(format!("job {}", c.job_id))),
        };
    }
    Decision::Write(ops, Plan::Job(c.job_id))
}

/// The `job.start` op of a job not in the mirror, once its id is unused
/// (as a request id, and as the root of its turns' derived request ids),
/// its moment is live and a seat is configured.
fn new_job(mirror: &Mirror, c: &StartJob) -> Result<OpBody, EngineError> {
    known_request(mirror, Some(&c.job_id), OpKind::JobStart, None)?;
    // A new job's derived request ids must be unused (as a
    // recall's), or it would adopt a client's turn as its own.
    if let Some(request_id) = (0..c.seats.len())
        .map(|i| job_turn_request_id(&c.job_id, i))
        .find(|r| mirror.requests.contains_key(r.as_str()))
    {
        return Err(Conflict::DerivedRequestId { request_id }.into());
    }
    live(mirror, c.moment_id)?;
    if c.seats.is_empty() {
        return Err(EngineError::Invalid("no brain seat is configured".into()));
    }
    Ok(OpBody::JobStart(JobStart {
        job_id: c.job_id.clone(),
        moment_id: c.moment_id,
        seats: c.seats.clone(),
        device: c.device.clone(),
    }))
}

/// Pushes onto `ops` a `turn.start` for each seat whose derived request id
/// (`<job id>:<index>`) is not written yet, each with a fresh turn id.
///
/// Errors: a request id conflict, or [`EngineError::MomentNotFound`] /
/// [`EngineError::Deleted`] when a turn is missing and the moment is not
/// live.
fn push_missing_turns(
    mirror: &Mirror,
    c: &StartJob,
    moment_id: Id,
    seats: &[String],
    mint: &mut dyn FnMut() -> Id,
    ops: &mut Vec<OpBody>,
) -> Result<(), EngineError> {
    let mut minted = Vec::new();
    for (index, seat) in seats.iter().enumerate() {
        let request_id = job_turn_request_id(&c.job_id, index);
        if known_request(mirror, Some(&request_id), OpKind::TurnStart, None)?.is_some() {
            continue;
        }
        // A turn needs a live moment (the fold refuses one on a tombstone,
        // after the op is durable): a torn job's retry on a moment deleted
        // since is refused.
        live(mirror, moment_id)?;
        let id = loop {
            let id = mint_new(mirror, mint);
            if !minted.contains(&id) {
                break id;
            }
        };
        minted.push(id);
        ops.push(turn_start(
            id,
            moment_id,
            seat,
            TurnMode::Practical,
            request_id,
            &c.device,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
