//! What a server allows of sessions, and the arithmetic of sharing: how long a session may
//! live, how many a key may hold, and how much of the memory all runs share the sessions of
//! one key may hold while idle.

use std::time::Duration;

use crate::error::RunError;
use crate::units::format_size;

/// What a server allows of sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    /// Idle time after which a session ends, unless the request asks for another.
    pub default_ttl: Duration,
    /// The longest idle TTL a request may ask for.
    pub max_ttl: Duration,
    /// A session ends this long after it was created, however busy.
    pub max_lifetime: Duration,
    /// Idle time after which a paused session ends (it replaces the session's idle TTL while
    /// it is paused; the maximum lifetime still applies).
    pub paused_ttl: Duration,
    /// Live sessions at most, in total and per API key (429 beyond).
    pub max_total: usize,
    pub max_per_owner: usize,
    /// How many API keys may hold sessions (1 without keys): the memory and disk that idle
    /// sessions hold is shared between them (see [`owner_share`]).
    pub keys: usize,
}

impl Default for SessionPolicy {
    fn default() -> Self {
        SessionPolicy {
            default_ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(3600),
            max_lifetime: Duration::from_secs(4 * 3600),
            paused_ttl: Duration::from_secs(3600),
            max_total: 32,
            max_per_owner: 8,
            keys: 1,
        }
    }
}

impl SessionPolicy {
    /// The idle time to live a creation asks for (seconds), within the policy.
    pub fn ttl(&self, asked: Option<f64>) -> Result<Duration, RunError> {
        match asked {
            None => Ok(self.default_ttl),
            Some(t) if t.is_finite() && t > 0.0 => {
                let ttl = Duration::from_secs_f64(t.min(1e9));
                if ttl > self.max_ttl {
                    return Err(RunError::invalid(format!(
                        "ttl is {t} s, above the maximum of {} s.",
                        self.max_ttl.as_secs()
                    )));
                }
                Ok(ttl)
            }
            Some(t) => Err(RunError::invalid(format!(
                "ttl must be a positive number of seconds, not {t}."
            ))),
        }
    }
}

/// The most of `budget` one key's sessions may hold, when `others` other keys hold some and
/// `keys` keys may hold sessions at all: an equal share among the keys holding sessions and
/// one more that may come, never more than an equal share among all keys. With one key (or
/// none) it is the whole budget; with two, half each; with many, a newcomer always finds
/// room beside those already there.
pub fn owner_share(budget: u64, keys: usize, others: usize) -> u64 {
    let parties = keys.min(others.saturating_add(2)).max(1) as u64;
    budget / parties
}

/// What idle sessions hold (memory and their in-memory disk), checked before a new one is
/// built: within the budget of all runs, and within its owner's share of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holdings {
    /// Held by every live session.
    pub total: u64,
    /// Held by the asking key's sessions.
    pub owner: u64,
    /// Other keys holding sessions.
    pub others: usize,
}

impl Holdings {
    /// Whether a session that holds `wanted` fits; the refusal says why otherwise.
    pub fn admit(&self, wanted: u64, budget: u64, keys: usize) -> Result<(), RunError> {
        if self.total.saturating_add(wanted) > budget {
            return Err(RunError::rate_limited(format!(
                "The live sessions hold {} of memory and disk, and this one would need {} \
                 more: beyond what the server gives all runs together ({}). Delete a \
                 session, ask for less memory or disk, or retry once one has expired.",
                format_size(self.total),
                format_size(wanted),
                format_size(budget)
            )));
        }
        let share = owner_share(budget, keys, self.others);
        if self.owner.saturating_add(wanted) > share {
            return Err(RunError::rate_limited(format!(
                "This API key's sessions hold {} of memory and disk, and this one would need \
                 {} more: beyond the key's share of what sessions may hold ({} of {}, shared \
                 with the other keys). Delete one of its sessions, ask for less memory or \
                 disk, or retry once one has expired.",
                format_size(self.owner),
                format_size(wanted),
                format_size(share),
                format_size(budget)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_may_hold_everything_and_many_keys_share() {
        assert_eq!(owner_share(100, 1, 0), 100);
        // Two keys: half each, whoever came first.
        assert_eq!(owner_share(100, 2, 0), 50);
        assert_eq!(owner_share(100, 2, 1), 50);
        // Ten keys: alone, half (room for the next); beside two others, a quarter.
        assert_eq!(owner_share(100, 10, 0), 50);
        assert_eq!(owner_share(100, 10, 2), 25);
        // Never below an equal share among all keys.
        assert_eq!(owner_share(100, 3, 10), 33);
        // No keys configured counts as one.
        assert_eq!(owner_share(100, 0, 0), 100);
    }

    #[test]
    fn a_key_cannot_take_the_whole_session_budget() {
        let gib = 1u64 << 30;
        // The attack: one key holding 20 of 20.6 GiB; now it may hold half.
        let budget = 20 * gib + 600 * (1 << 20);
        let first = Holdings {
            total: 0,
            owner: 0,
            others: 0,
        };
        assert!(first.admit(10 * gib, budget, 2).is_ok());
        let second = Holdings {
            total: 10 * gib,
            owner: 10 * gib,
            others: 0,
        };
        let e = second.admit(10 * gib, budget, 2).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::RateLimited);
        assert!(e.message.contains("share"), "{e}");
        // Another key still finds room.
        let other = Holdings {
            total: 10 * gib,
            owner: 0,
            others: 1,
        };
        assert!(other.admit(10 * gib, budget, 2).is_ok());
        // Alone on a server with one key: all of it.
        assert!(second.admit(10 * gib, budget, 1).is_ok());
    }

    #[test]
    fn ttls_are_bounded() {
        let p = SessionPolicy::default();
        assert_eq!(p.ttl(None).unwrap(), p.default_ttl);
        assert_eq!(p.ttl(Some(1.5)).unwrap(), Duration::from_millis(1500));
        assert!(p.ttl(Some(0.0)).is_err());
        assert!(p.ttl(Some(-1.0)).is_err());
        assert!(p.ttl(Some(f64::NAN)).is_err());
        let e = p.ttl(Some(7200.0)).unwrap_err();
        assert!(e.message.contains("above the maximum"), "{e}");
    }
}
