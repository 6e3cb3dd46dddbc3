//! What `Fallback::Local` admitted while Redis could not answer, owed to Redis per key.
//!
//! One debt per Redis key, whatever the number of admissions: a new admission merges into
//! the key's debt (its units added, the later time kept, a new sequence number), so the
//! ledger holds at most `max_keys` keys and the fallback refuses a new key rather than
//! owe for one more (`Denial::TooManyKeys`, decided locally). A debt being sent is marked,
//! so a key is never repaid by two calls at once (Redis applies an addition only if its
//! sequence number is above the last it applied for this limiter, so two in flight could
//! drop one).

use std::collections::HashMap;

/// Units owed for one key: their sum, the latest admission time (ms) and a sequence
/// number for Redis to apply the addition once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Owed {
    pub(super) cost: u64,
    pub(super) at: u64,
    pub(super) seq: u64,
}

impl Owed {
    /// `self` and `later` as one addition: counted at the later time (conservative: the
    /// units stay in the window as long as the latest of them), under the later number.
    fn merge(self, later: Owed) -> Owed {
        Owed {
            cost: self.cost.saturating_add(later.cost),
            at: self.at.max(later.at),
            seq: self.seq.max(later.seq),
        }
    }
}

#[derive(Debug, Default)]
struct Debt {
    /// Not yet sent.
    pending: Option<Owed>,
    /// Being sent (its units still owed until it lands).
    sending: bool,
}

/// What [`Ledger::take`] found for a key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Take {
    /// Nothing owed.
    Nothing,
    /// Another call is sending this key's debt.
    Busy,
    /// This debt, marked as being sent.
    Pay(Owed),
}

/// Every key's debt.
#[derive(Debug)]
pub(super) struct Ledger {
    debts: HashMap<String, Debt>,
    units: u64,
    max_keys: usize,
}

impl Ledger {
    pub(super) fn new(max_keys: usize) -> Ledger {
        Ledger { debts: HashMap::new(), units: 0, max_keys }
    }

    /// Units owed, pending or being sent.
    pub(super) fn units(&self) -> u64 {
        self.units
    }

    /// Keys that owe.
    pub(super) fn keys(&self) -> usize {
        self.debts.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.debts.is_empty()
    }

    /// Whether `key` may owe (more): it owes already, or the ledger has room for one more key.
    pub(super) fn has_room_for(&self, key: &str) -> bool {
        self.debts.len() < self.max_keys || self.debts.contains_key(key)
    }

    /// Records an admission of `owed` for `key` (the caller checked [`has_room_for`]).
    ///
    /// [`has_room_for`]: Ledger::has_room_for
    pub(super) fn owe(&mut self, key: &str, owed: Owed) {
        self.units = self.units.saturating_add(owed.cost);
        match self.debts.get_mut(key) {
            Some(debt) => debt.pending = Some(debt.pending.map_or(owed, |p| p.merge(owed))),
            None => {
                self.debts.insert(key.to_owned(), Debt { pending: Some(owed), sending: false });
            }
        }
    }

    /// `key`'s pending debt, marked as being sent.
    pub(super) fn take(&mut self, key: &str) -> Take {
        match self.debts.get_mut(key) {
            None => Take::Nothing,
            Some(debt) if debt.sending => Take::Busy,
            Some(debt) => match debt.pending.take() {
                Some(owed) => {
                    debt.sending = true;
                    Take::Pay(owed)
                }
                None => Take::Nothing,
            },
        }
    }

    /// Up to `most` pending debts of keys other than `except`, marked as being sent.
    pub(super) fn take_others(&mut self, most: usize, except: &str) -> Vec<(String, Owed)> {
        let mut taken = Vec::new();
        for (key, debt) in &mut self.debts {
            if taken.len() >= most {
                break;
            }
            if debt.sending || key == except {
                continue;
            }
            if let Some(owed) = debt.pending.take() {
                debt.sending = true;
                taken.push((key.clone(), owed));
            }
        }
        taken
    }

    /// The debt sent for `key` landed, or can never land (dropped): forgotten.
    pub(super) fn settle(&mut self, key: &str, sent: Owed) {
        self.units = self.units.saturating_sub(sent.cost);
        if let Some(debt) = self.debts.get_mut(key) {
            debt.sending = false;
            if debt.pending.is_none() {
                self.debts.remove(key);
            }
        }
    }

    /// The debt sent for `key` did not land (Redis unavailable): owed again, merged with
    /// what the key came to owe meanwhile. If the lost call had in fact been applied and
    /// more was owed meanwhile, the merged addition counts it again (conservative).
    pub(super) fn restore(&mut self, key: &str, sent: Owed) {
        if let Some(debt) = self.debts.get_mut(key) {
            debt.sending = false;
            debt.pending = Some(debt.pending.map_or(sent, |p| sent.merge(p)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(cost: u64, at: u64, seq: u64) -> Owed {
        Owed { cost, at, seq }
    }

    #[test]
    fn one_debt_per_key_and_no_new_key_when_full() {
        let mut ledger = Ledger::new(2);
        ledger.owe("a", owed(1, 10, 1));
        ledger.owe("a", owed(2, 30, 2));
        ledger.owe("b", owed(1, 20, 3));
        assert_eq!((ledger.keys(), ledger.units()), (2, 4));
        assert!(ledger.has_room_for("a") && !ledger.has_room_for("c"));
        assert_eq!(ledger.take("a"), Take::Pay(owed(3, 30, 2)));
        // A key being sent takes no second sender, but may owe more meanwhile.
        assert_eq!(ledger.take("a"), Take::Busy);
        ledger.owe("a", owed(5, 40, 4));
        assert_eq!(ledger.take_others(8, "b"), vec![]);
        ledger.settle("a", owed(3, 30, 2));
        assert_eq!((ledger.keys(), ledger.units()), (2, 6));
        assert_eq!(ledger.take("a"), Take::Pay(owed(5, 40, 4)));
        ledger.settle("a", owed(5, 40, 4));
        assert_eq!(ledger.take("a"), Take::Nothing);
        assert!(ledger.has_room_for("c"));
    }

    #[test]
    fn a_debt_that_did_not_land_is_owed_again_merged() {
        let mut ledger = Ledger::new(8);
        ledger.owe("a", owed(2, 10, 1));
        let Take::Pay(sent) = ledger.take("a") else { panic!("owed") };
        ledger.owe("a", owed(1, 50, 2));
        ledger.restore("a", sent);
        assert_eq!(ledger.units(), 3);
        assert_eq!(ledger.take("a"), Take::Pay(owed(3, 50, 2)));
        ledger.restore("a", owed(3, 50, 2));
        let others = ledger.take_others(8, "z");
        assert_eq!(others, vec![("a".to_owned(), owed(3, 50, 2))]);
        ledger.settle("a", owed(3, 50, 2));
        assert!(ledger.is_empty());
        assert_eq!(ledger.units(), 0);
    }
}
