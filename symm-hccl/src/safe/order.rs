//! Ordering one ACL stream after another's work without a host synchronization: an ACL event
//! recorded at the end of the producing stream, and `aclrtStreamWaitEvent` on the consuming one.
//! This is how a tensor made by a symm operation on one stream is consumed by an HCCL
//! collective on another, and the reverse.
//!
//! ```text
//! producer: [ symm put + signal ][record e]
//! HCCL:                                  [wait e][ HcclAllReduce ]
//! ```
//!
//! The host returns as soon as both calls are enqueued. The events made here are kept until
//! they are seen complete (queried at the next ordering) or the [`StreamOrder`] is dropped.
//! ACL's documentation of `aclrtDestroyEvent` (`hicann/runtime`, `docs/api_docs/`) allows
//! destroying an event that has not completed (its resources go when it completes) but asks
//! that no other call still be using it; whether a queued `aclrtStreamWaitEvent` is such a use
//! is not said, so the events are kept while they may be. None of this has run on a device.

use std::sync::Mutex;

use ascend_sys::safe::{Event, Stream};

use crate::result::Result;

/// What a stream is ordered after: everything enqueued so far on a stream, or an event the
/// caller recorded (which it keeps alive until the waiting stream has passed the wait).
#[derive(Clone, Copy, Debug)]
pub enum Producer<'a> {
    /// The work enqueued on this stream so far.
    Stream(&'a Stream),
    /// The point this event was last recorded at.
    Event(&'a Event),
}

impl<'a> From<&'a Stream> for Producer<'a> {
    fn from(stream: &'a Stream) -> Self {
        Producer::Stream(stream)
    }
}

impl<'a> From<&'a Event> for Producer<'a> {
    fn from(event: &'a Event) -> Self {
        Producer::Event(event)
    }
}

/// Orders streams after one another, holding the events it records until they complete.
#[derive(Debug, Default)]
pub struct StreamOrder {
    in_flight: Mutex<Vec<Event>>,
}

impl StreamOrder {
    /// A new, empty one.
    pub fn new() -> StreamOrder {
        StreamOrder::default()
    }

    /// Makes the work enqueued on `waiter` from now on wait until `producer`'s work (enqueued
    /// so far, or up to its event) has completed; the host does not wait. ACL needs the calling
    /// thread's device set.
    pub fn after<'a>(&self, waiter: &Stream, producer: impl Into<Producer<'a>>) -> Result<()> {
        match producer.into() {
            Producer::Event(event) => Ok(waiter.wait_event(event)?),
            Producer::Stream(stream) => {
                let event = Event::create()?;
                event.record(stream)?;
                waiter.wait_event(&event)?;
                let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                // Forget the events already passed (an error querying one keeps it: dropping it
                // early is the one thing to avoid), then keep this one.
                in_flight.retain(|e| !e.query().unwrap_or(false));
                in_flight.push(event);
                Ok(())
            }
        }
    }

    /// The events recorded and not yet seen complete.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
