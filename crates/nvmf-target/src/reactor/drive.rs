//! Driving a connection without a socket: submitting its backend requests, and running it to
//! quiescence against a synchronous engine (tests and fuzzers).

use crate::backend::IoEngine;
use crate::command::BackendRequest;
use crate::transport::tcp::Connection;
use std::time::Instant;

/// Submits the backend requests the connection queued (the state machine makes none itself).
pub fn submit(conn: &mut Connection, engine: &mut IoEngine) {
    for r in conn.backend_requests() {
        match r {
            // SAFETY: the command layer keeps each request's buffer valid and unmoved until its
            // completion is handed back, and the reactor keeps a closed connection until
            // in_flight() is 0.
            BackendRequest::Submit(backend, req) => unsafe { engine.submit(backend, req) },
            BackendRequest::Done(tag) => engine.complete_now(tag, Ok(())),
        }
    }
}

/// A reactor turn for one connection without a socket, for tests and fuzzing: process input,
/// submit the backend requests, then run completions until nothing is left to do.
pub fn drive(conn: &mut Connection, now: Instant, engine: &mut IoEngine) {
    let mut done = Vec::new();
    loop {
        conn.process(now);
        submit(conn, engine);
        engine.flush();
        engine.reap(&mut done);
        if done.is_empty() {
            if engine.in_flight() == 0 {
                return;
            }
            engine.wait_one();
            continue;
        }
        for c in done.drain(..) {
            conn.complete_io(c);
        }
        submit(conn, engine);
    }
}

/// [`drive`], then takes everything queued for the host, again while writing it freed buffers
/// that held commands wait for.
pub fn drive_and_take_output(conn: &mut Connection, now: Instant, engine: &mut IoEngine) -> Vec<u8> {
    let mut all = Vec::new();
    loop {
        drive(conn, now, engine);
        let out = conn.take_output();
        let wrote = !out.is_empty();
        all.extend_from_slice(&out);
        if !(wrote && conn.wants().hold) {
            return all;
        }
    }
}
