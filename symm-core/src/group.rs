//! The group model: an ordered list of global ranks, and the cache that makes a group's identity.
//!
//! A group is its rank list: two groups with the same list are the same group, with the same
//! [`GroupId`] on every rank (computed from the list, so no communication is needed to agree on
//! it) and, through [`GroupRegistry`], the same state object inside one process.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{AtRank, GroupError};
use crate::rank::{GroupRank, Rank};
use crate::stream::PendingStreamOps;

/// This machine's identity for the one-node rule: its host name and boot id, which ranks
/// exchange at start-up (`SYMM_HOST_ID` overrides it); ranks with the same identity share a
/// host.
pub fn host_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    format!("{}/{}", read("/proc/sys/kernel/hostname"), read("/proc/sys/kernel/random/boot_id"))
}

/// A group's identity: a hash of its ordered rank list, never 0 (0 marks a free slot in
/// backend tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId(pub u64);

impl GroupId {
    /// The identity of the ordered rank list (FNV-1a over the length and the ranks).
    pub fn of(ranks: &[Rank]) -> GroupId {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for word in std::iter::once(ranks.len() as u64).chain(ranks.iter().map(|r| u64::from(r.0))) {
            for byte in word.to_le_bytes() {
                h ^= u64::from(byte);
                h = h.wrapping_mul(PRIME);
            }
        }
        GroupId(h.max(1))
    }
}

/// A set of ranks of one node, in a chosen order. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Group(Arc<GroupInner>);

struct GroupInner {
    id: GroupId,
    ranks: Box<[Rank]>,
    /// Global rank -> group rank, for every rank of the world (`u32::MAX`: not a member).
    local_of: Box<[u32]>,
    me: Option<GroupRank>,
    /// Whether the group may be used from this rank: Err when it spans hosts.
    usable: Result<(), GroupError>,
    /// The state a collective engine keeps for the group (workspace, round numbers), created
    /// on first use and read without a lock on every call (see [`Group::engine_state`]).
    engine: OnceLock<EngineState>,
    /// Serialises first uses, so that concurrent ones create the state once.
    engine_init: Mutex<()>,
    /// This rank's stream operations on the group not yet completed (see [`crate::stream`]).
    stream_ops: PendingStreamOps,
}

impl Group {
    /// A group of `ranks` (global, in group order) seen from `caller`, in a world of
    /// `world_size` ranks. `usable` is the backend's verdict on locality (hosts).
    pub fn new(
        world_size: usize,
        caller: Rank,
        ranks: &[Rank],
        usable: Result<(), GroupError>,
    ) -> Result<Group, GroupError> {
        let as_i64 = || ranks.iter().map(|r| i64::from(r.0)).collect::<Vec<_>>();
        if ranks.is_empty() {
            return Err(GroupError::BadRankList { ranks: vec![], reason: "a group needs at least one rank" });
        }
        let mut local_of = vec![u32::MAX; world_size].into_boxed_slice();
        for (i, r) in ranks.iter().enumerate() {
            let slot = local_of
                .get_mut(r.index())
                .ok_or_else(|| GroupError::BadRankList { ranks: as_i64(), reason: "a rank is outside the world" })?;
            if *slot != u32::MAX {
                return Err(GroupError::BadRankList { ranks: as_i64(), reason: "a rank appears twice" });
            }
            *slot = i as u32;
        }
        let me = local_of.get(caller.index()).copied().filter(|&l| l != u32::MAX).map(GroupRank);
        Ok(Group(Arc::new(GroupInner {
            id: GroupId::of(ranks),
            ranks: ranks.into(),
            local_of,
            me,
            usable,
            engine: OnceLock::new(),
            engine_init: Mutex::new(()),
            stream_ops: PendingStreamOps::default(),
        })))
    }

    /// For stream-ordered backends: an operation on the group was enqueued on a stream of this
    /// rank; [`Group::stream_op_completed`] must follow when it has completed (failed or not).
    pub fn stream_op_enqueued(&self) {
        self.0.stream_ops.enqueued();
    }

    /// For stream-ordered backends: an operation counted by [`Group::stream_op_enqueued`] has
    /// completed; host calls on the group waiting for it may go on.
    pub fn stream_op_completed(&self) {
        self.0.stream_ops.completed();
    }

    /// Returns once this rank's stream operations on the group have completed (at once when
    /// there are none, or on a stream's own thread): what every host call on the group does
    /// first ([`crate::stream`]). `Error::Timeout` naming `op` after `timeout`.
    #[inline]
    pub fn settle_streams(&self, rank: Rank, op: &str, timeout: std::time::Duration) -> crate::Result<()> {
        self.0.stream_ops.settle(rank, op, self.ranks(), timeout)
    }

    /// The group's identity.
    pub fn id(&self) -> GroupId {
        self.0.id
    }

    /// The members' global ranks, in group order.
    pub fn ranks(&self) -> &[Rank] {
        &self.0.ranks
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.0.ranks.len()
    }

    /// The caller's rank in the group, if it is a member.
    pub fn my_rank(&self) -> Option<GroupRank> {
        self.0.me
    }

    /// The caller's rank in the group; an error if it is not a member or the group cannot be
    /// used from this host.
    #[inline]
    pub fn member(&self) -> Result<GroupRank, GroupError> {
        // Every call checks this: the answer of a usable group's member is a load and a branch.
        match (&self.0.usable, self.0.me) {
            (Ok(()), Some(me)) => Ok(me),
            _ => Err(self.not_member()),
        }
    }

    /// Why [`Group::member`] fails.
    #[cold]
    fn not_member(&self) -> GroupError {
        match &self.0.usable {
            Err(e) => e.clone(),
            Ok(()) => GroupError::NotMember { ranks: self.ranks().to_vec() },
        }
    }

    /// The global rank of a member.
    pub fn to_global(&self, local: GroupRank) -> Option<Rank> {
        self.0.ranks.get(local.index()).copied()
    }

    /// The rank inside this group of a global rank, if it is a member.
    pub fn to_local(&self, global: Rank) -> Option<GroupRank> {
        self.0.local_of.get(global.index()).copied().filter(|&l| l != u32::MAX).map(GroupRank)
    }

    /// Validates a group-local rank argument (as a user passed it) and maps it to the global rank.
    #[inline]
    pub fn resolve(&self, arg: &'static str, local: i64) -> Result<(GroupRank, Rank), GroupError> {
        match usize::try_from(local).ok().and_then(|l| self.0.ranks.get(l)) {
            Some(&g) => Ok((GroupRank(local as u32), g)),
            None => Err(self.out_of_range(arg, local)),
        }
    }

    /// Why [`Group::resolve`] fails.
    #[cold]
    fn out_of_range(&self, arg: &'static str, local: i64) -> GroupError {
        GroupError::RankOutOfRange { arg, value: local, size: self.size(), ranks: self.ranks().to_vec() }
    }

    /// The state of type `T` a collective engine keeps for this group, created by `init` on
    /// first use (under a lock, so concurrent first uses create it once). A failed `init`
    /// leaves nothing behind. Once created, a call is a lock-free read and a type check.
    ///
    /// A group holds one engine's state: asking for another type than the one created is an
    /// error naming both (one process runs one backend, and a backend one engine per group).
    /// Errors are `init`'s, and `GroupError::OtherEngine` raised by `rank`.
    #[inline]
    pub fn engine_state<T: Any + Send + Sync>(
        &self,
        rank: Rank,
        init: impl FnOnce() -> crate::Result<T>,
    ) -> crate::Result<&T> {
        match self.0.engine.get().map(EngineState::get) {
            Some(Some(existing)) => Ok(existing),
            _ => self.create_engine_state(rank, init),
        }
    }

    /// [`Group::engine_state`]'s first use: creates the state under the lock.
    #[cold]
    fn create_engine_state<T: Any + Send + Sync>(
        &self,
        rank: Rank,
        init: impl FnOnce() -> crate::Result<T>,
    ) -> crate::Result<&T> {
        // A poisoned lock means a thread panicked in `init`; nothing was set.
        let _first = self.0.engine_init.lock().unwrap_or_else(|e| e.into_inner());
        let existing = match self.0.engine.get() {
            Some(existing) => existing,
            None => {
                let created = init()?;
                self.0.engine.get_or_init(|| EngineState::new(created))
            }
        };
        existing.get().ok_or_else(|| self.other_engine::<T>(existing)).at(rank)
    }

    /// Why [`Group::engine_state`] found no `T`.
    #[cold]
    fn other_engine<T>(&self, existing: &EngineState) -> GroupError {
        GroupError::OtherEngine {
            ranks: self.ranks().to_vec(),
            has: existing.type_name,
            wanted: std::any::type_name::<T>(),
        }
    }

    /// Whether two handles are the same cached group object.
    pub fn same_object(&self, other: &Group) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A collective engine's state of a group, of a type fixed when it was created.
struct EngineState {
    type_name: &'static str,
    state: Box<dyn Any + Send + Sync>,
}

impl EngineState {
    fn new<T: Any + Send + Sync>(state: T) -> EngineState {
        EngineState { type_name: std::any::type_name::<T>(), state: Box::new(state) }
    }

    /// The state, if it is a `T`.
    #[inline]
    fn get<T: Any>(&self) -> Option<&T> {
        self.state.downcast_ref::<T>()
    }
}

impl PartialEq for Group {
    fn eq(&self, other: &Group) -> bool {
        self.0.id == other.0.id && self.0.ranks == other.0.ranks
    }
}

impl Eq for Group {}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Group{:?}", self.ranks())
    }
}

/// The per-process cache of groups: asking for the same rank list again returns the same object.
pub struct GroupRegistry {
    world_size: usize,
    caller: Rank,
    groups: Mutex<HashMap<Box<[Rank]>, Group>>,
}

impl GroupRegistry {
    /// An empty registry for `caller` in a world of `world_size`.
    pub fn new(world_size: usize, caller: Rank) -> Self {
        GroupRegistry { world_size, caller, groups: Mutex::new(HashMap::new()) }
    }

    /// The cached group for `ranks`, or a new one: `locality` judges whether the ranks lie on
    /// the caller's host and `on_create` lets the backend set up its per-group state (run once,
    /// only for a group the caller is a member of and may use).
    pub fn get_or_create(
        &self,
        ranks: &[Rank],
        locality: impl FnOnce(&[Rank]) -> Result<(), GroupError>,
        on_create: impl FnOnce(&Group) -> Result<(), GroupError>,
    ) -> Result<Group, GroupError> {
        // A poisoned lock only means another thread panicked while inserting; the map is
        // still consistent (insertions are single calls), so keep using it.
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = groups.get(ranks) {
            return Ok(g.clone());
        }
        let group = Group::new(self.world_size, self.caller, ranks, Ok(()))?;
        let usable = locality(ranks);
        let group = if usable.is_ok() { group } else { Group::new(self.world_size, self.caller, ranks, usable)? };
        if group.member().is_ok() {
            on_create(&group)?;
        }
        groups.insert(ranks.into(), group.clone());
        Ok(group)
    }
}

impl fmt::Debug for GroupRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupRegistry").field("world_size", &self.world_size).field("caller", &self.caller).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(v: &[u32]) -> Vec<Rank> {
        v.iter().map(|&r| Rank(r)).collect()
    }

    #[test]
    fn engine_state_is_created_once_survives_a_failed_init_and_refuses_another_type() {
        let g = Group::new(2, Rank(0), &ranks(&[0, 1]), Ok(())).unwrap();
        let failed = g.engine_state::<u64>(Rank(0), || {
            Err(crate::Error::Unsupported { rank: Rank(0), backend: "test", what: "x".into() })
        });
        assert!(failed.is_err());
        // A failed init leaves the slot empty: the next first use creates the state.
        assert_eq!(*g.engine_state(Rank(0), || Ok(7u64)).unwrap(), 7);
        assert_eq!(*g.engine_state(Rank(0), || -> crate::Result<u64> { panic!("created twice") }).unwrap(), 7);
        let e = g.engine_state(Rank(0), || Ok(1u32)).unwrap_err();
        assert!(matches!(e, crate::Error::Group { source: GroupError::OtherEngine { .. }, .. }), "{e}");
        assert!(e.to_string().contains("u64") && e.to_string().contains("u32"), "{e}");
    }

    #[test]
    fn arbitrary_orders_map_both_ways() {
        let g = Group::new(4, Rank(1), &ranks(&[3, 1]), Ok(())).unwrap();
        assert_eq!(g.my_rank(), Some(GroupRank(1)));
        assert_eq!(g.to_global(GroupRank(0)), Some(Rank(3)));
        assert_eq!(g.to_local(Rank(3)), Some(GroupRank(0)));
        assert_eq!(g.to_local(Rank(0)), None);
        assert_eq!(g.resolve("target_rank", 1).unwrap(), (GroupRank(1), Rank(1)));
        let e = g.resolve("target_rank", 2).unwrap_err().to_string();
        assert!(e.contains("target_rank = 2") && e.contains("[3, 1]"), "{e}");
        assert!(g.resolve("target_rank", -1).is_err());
    }

    #[test]
    fn identity_depends_on_order_and_members() {
        assert_eq!(GroupId::of(&ranks(&[0, 2, 3])), GroupId::of(&ranks(&[0, 2, 3])));
        assert_ne!(GroupId::of(&ranks(&[0, 2, 3])), GroupId::of(&ranks(&[0, 3, 2])));
        assert_ne!(GroupId::of(&ranks(&[0])), GroupId::of(&ranks(&[0, 0])));
    }

    #[test]
    fn bad_lists_and_non_members_are_errors() {
        assert!(Group::new(4, Rank(0), &[], Ok(())).is_err());
        assert!(Group::new(4, Rank(0), &ranks(&[1, 1]), Ok(())).unwrap_err().to_string().contains("twice"));
        assert!(Group::new(4, Rank(0), &ranks(&[4]), Ok(())).unwrap_err().to_string().contains("outside"));
        let g = Group::new(4, Rank(0), &ranks(&[1, 2]), Ok(())).unwrap();
        assert!(matches!(g.member(), Err(GroupError::NotMember { .. })));
    }

    #[test]
    fn registry_returns_the_same_object() {
        let reg = GroupRegistry::new(4, Rank(2));
        let mut created = 0;
        let a = reg
            .get_or_create(
                &ranks(&[0, 2]),
                |_| Ok(()),
                |_| {
                    created += 1;
                    Ok(())
                },
            )
            .unwrap();
        let b = reg
            .get_or_create(
                &ranks(&[0, 2]),
                |_| Ok(()),
                |_| {
                    created += 1;
                    Ok(())
                },
            )
            .unwrap();
        assert!(a.same_object(&b));
        assert_eq!(created, 1);
    }
}
