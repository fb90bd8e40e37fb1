//! Scope kinds and typed scope keys: who shares a budget.

use std::fmt;
use std::ops::{Index, IndexMut};

use crate::scope::rules::Request;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// A plain number: map your own identifiers (database ids, interned names) to it
        /// once, outside the hot path. `Display` prints the number.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);

        impl From<u64> for $name {
            fn from(id: u64) -> $name {
                $name(id)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// A tenant (a customer organisation).
    TenantId
);
id_type!(
    /// A user.
    UserId
);
id_type!(
    /// An API key (its record's id, never the secret).
    ApiKeyId
);
id_type!(
    /// A route or endpoint.
    RouteId
);
id_type!(
    /// A client address: the keyed hash of an IP address or network (the HTTP layer's
    /// `Key::client_ip()`), never the address itself.
    ClientId
);

/// The one list of keyed scope kinds, in lock order (the global kind comes first and has
/// no key). Each line: the kind's docs, its variant, its name, and the [`Request`] fields
/// that make its key, with their types.
///
/// Adding a kind is one line here and its field on [`Request`]: [`ScopeKind`], [`Scope`]
/// (variant, kind, `Display`, [`Scope::from_ids`]), [`ScopeKind::key_bytes`], a request's
/// scopes, the limiter's maps and their lock order are generated from this list. Every
/// other crate of the workspace (the HTTP layer, the configuration format, telemetry)
/// sizes its per-kind arrays as [`PerKind`], indexes them by [`ScopeKind`], and matches on
/// [`ScopeKind`] exhaustively (no `_` arm) or iterates [`ScopeKind::ALL`], so a new kind
/// fails to compile wherever it is not handled.
///
/// `$callback` is a macro taking the list as one bracketed token tree.
macro_rules! with_keyed_kinds {
    ($callback:ident) => {
        $callback! { [
            /// One bucket per tenant.
            Tenant "tenant" (tenant: TenantId),
            /// One bucket per user.
            User "user" (user: UserId),
            /// One bucket per API key.
            ApiKey "api_key" (api_key: ApiKeyId),
            /// One bucket per client address (an IP address or network).
            Client "client" (client: ClientId),
            /// One bucket per route.
            Route "route" (route: RouteId),
            /// One bucket per (tenant, route) pair.
            TenantRoute "tenant_route" (tenant: TenantId, route: RouteId),
        ] }
    };
}
pub(crate) use with_keyed_kinds;

macro_rules! define_kinds {
    ([$($(#[$doc:meta])* $kind:ident $name:literal ($($field:ident: $ty:ty),+)),* $(,)?]) => {
        /// The kinds of scope, in the fixed order a scoped limiter locks their maps in.
        ///
        /// ```
        /// use tokengate::scope::ScopeKind;
        /// assert_eq!(ScopeKind::TenantRoute.to_string(), "tenant_route");
        /// assert!(ScopeKind::Tenant < ScopeKind::User);
        /// assert_eq!(ScopeKind::ALL.len(), ScopeKind::COUNT);
        /// assert_eq!(ScopeKind::ALL[0], ScopeKind::Global);
        /// ```
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ScopeKind {
            /// One bucket for every request.
            Global,
            $($(#[$doc])* $kind,)*
        }

        impl ScopeKind {
            /// How many kinds there are.
            pub const COUNT: usize = [ScopeKind::Global $(, ScopeKind::$kind)*].len();

            /// Every kind, in order.
            pub const ALL: [ScopeKind; ScopeKind::COUNT] = [ScopeKind::Global $(, ScopeKind::$kind)*];

            /// The name used in scope keys and records.
            pub const fn name(self) -> &'static str {
                match self {
                    ScopeKind::Global => "global",
                    $(ScopeKind::$kind => $name,)*
                }
            }

            /// The bytes of one key of this kind in the limiter's maps: the sum of its
            /// ids' sizes (0 for the global kind, which has no key).
            ///
            /// ```
            /// use tokengate::scope::ScopeKind;
            /// assert_eq!(ScopeKind::Global.key_bytes(), 0);
            /// assert_eq!(ScopeKind::Tenant.key_bytes(), 8);
            /// assert_eq!(ScopeKind::TenantRoute.key_bytes(), 16);
            /// ```
            pub const fn key_bytes(self) -> usize {
                match self {
                    ScopeKind::Global => 0,
                    $(ScopeKind::$kind => 0 $(+ std::mem::size_of::<$ty>())+,)*
                }
            }

            /// How many ids make a key of this kind (0 for the global kind), in the
            /// order [`Scope::from_ids`] takes them.
            ///
            /// ```
            /// use tokengate::scope::ScopeKind;
            /// assert_eq!(ScopeKind::Global.key_ids(), 0);
            /// assert_eq!(ScopeKind::User.key_ids(), 1);
            /// assert_eq!(ScopeKind::TenantRoute.key_ids(), 2);
            /// ```
            pub const fn key_ids(self) -> usize {
                match self {
                    ScopeKind::Global => 0,
                    $(ScopeKind::$kind => [$(stringify!($field)),+].len(),)*
                }
            }
        }

        /// One scope key: the budget a request pays into.
        ///
        /// Typed, `Copy`, at most 24 bytes: building one on the hot path formats nothing
        /// and allocates nothing. `Display` gives the textual form (`global`, `tenant:42`,
        /// `user:7`, `api_key:9`, `route:3`, `tenant:42:route:3`), for logs and metric
        /// labels.
        ///
        /// ```
        /// use tokengate::scope::{RouteId, Scope, ScopeKind, TenantId};
        /// let scope = Scope::TenantRoute(TenantId(42), RouteId(3));
        /// assert_eq!(scope.to_string(), "tenant:42:route:3");
        /// assert_eq!(scope.kind(), ScopeKind::TenantRoute);
        /// assert_eq!(Scope::Global.to_string(), "global");
        /// ```
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Scope {
            /// The global scope.
            Global,
            $(
                #[doc = concat!("A key of the `", $name, "` kind.")]
                $kind($($ty),+),
            )*
        }

        impl Scope {
            /// The kind of this scope.
            pub fn kind(&self) -> ScopeKind {
                match self {
                    Scope::Global => ScopeKind::Global,
                    $(Scope::$kind(..) => ScopeKind::$kind,)*
                }
            }

            /// The scope of `kind` keyed by `ids` (in the order of the kind's
            /// fields: `[tenant, route]` for [`ScopeKind::TenantRoute`]), or `None`
            /// when `ids` has not [`ScopeKind::key_ids`] of them.
            ///
            /// ```
            /// use tokengate::scope::{RouteId, Scope, ScopeKind, TenantId};
            /// assert_eq!(Scope::from_ids(ScopeKind::Global, &[]), Some(Scope::Global));
            /// assert_eq!(
            ///     Scope::from_ids(ScopeKind::TenantRoute, &[4, 2]),
            ///     Some(Scope::TenantRoute(TenantId(4), RouteId(2)))
            /// );
            /// assert_eq!(Scope::from_ids(ScopeKind::Tenant, &[4, 2]), None);
            /// ```
            pub fn from_ids(kind: ScopeKind, ids: &[u64]) -> Option<Scope> {
                match kind {
                    ScopeKind::Global => ids.is_empty().then_some(Scope::Global),
                    $(ScopeKind::$kind => match *ids {
                        [$($field),+] => Some(Scope::$kind($(<$ty>::from($field)),+)),
                        _ => None,
                    },)*
                }
            }

            /// The scope of `kind` that `request` names, if it names one (the global
            /// scope always).
            pub(crate) fn of(request: &Request, kind: ScopeKind) -> Option<Scope> {
                Some(match kind {
                    ScopeKind::Global => Scope::Global,
                    $(ScopeKind::$kind => Scope::$kind($(request.$field?),+),)*
                })
            }
        }

        impl fmt::Display for Scope {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    Scope::Global => f.write_str("global"),
                    $(Scope::$kind($($field),+) => {
                        let parts: &[(&str, &dyn fmt::Display)] =
                            &[$((stringify!($field), $field)),+];
                        for (i, (label, value)) in parts.iter().enumerate() {
                            if i > 0 {
                                f.write_str(":")?;
                            }
                            write!(f, "{label}:{value}")?;
                        }
                        Ok(())
                    })*
                }
            }
        }
    };
}

with_keyed_kinds!(define_kinds);

impl ScopeKind {
    /// Position in [`ScopeKind::ALL`]: the index of the kind's value in a [`PerKind`]
    /// array and its bit in a set of kinds.
    ///
    /// ```
    /// use tokengate::scope::ScopeKind;
    /// for (i, kind) in ScopeKind::ALL.into_iter().enumerate() {
    ///     assert_eq!(kind.index(), i);
    /// }
    /// ```
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ScopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One value per scope kind, in the order of [`ScopeKind::ALL`], indexed by a
/// [`ScopeKind`] (or its [`index`](ScopeKind::index)).
///
/// The array every crate keeps per kind (counters, quotas, keys): its length comes from
/// the kind list, so a new kind grows it, and indexing by kind cannot go out of bounds.
/// Build one with [`ScopeKind::ALL`]`.map(..)` or `Default::default()`.
///
/// ```
/// use tokengate::scope::{PerKind, ScopeKind};
/// let mut hits: PerKind<u64> = Default::default();
/// hits[ScopeKind::User] += 2;
/// let names: PerKind<&str> = ScopeKind::ALL.map(ScopeKind::name);
/// assert_eq!((hits[ScopeKind::User], names[ScopeKind::Route]), (2, "route"));
/// ```
pub type PerKind<T> = [T; ScopeKind::COUNT];

impl<T> Index<ScopeKind> for PerKind<T> {
    type Output = T;

    #[inline]
    fn index(&self, kind: ScopeKind) -> &T {
        &self[kind.index()]
    }
}

impl<T> IndexMut<ScopeKind> for PerKind<T> {
    #[inline]
    fn index_mut(&mut self, kind: ScopeKind) -> &mut T {
        &mut self[kind.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_uses_the_seed_forms() {
        let cases = [
            (Scope::Global, "global"),
            (Scope::Tenant(TenantId(42)), "tenant:42"),
            (Scope::User(UserId(7)), "user:7"),
            (Scope::ApiKey(ApiKeyId(9)), "api_key:9"),
            (Scope::Client(ClientId(5)), "client:5"),
            (Scope::Route(RouteId(3)), "route:3"),
            (
                Scope::TenantRoute(TenantId(42), RouteId(3)),
                "tenant:42:route:3",
            ),
        ];
        for (scope, text) in cases {
            assert_eq!(scope.to_string(), text);
        }
        assert!(std::mem::size_of::<Scope>() <= 24);
    }

    #[test]
    fn every_kind_is_in_order_and_names_its_scope_from_a_request() {
        let full = Request::new()
            .tenant(TenantId(1))
            .user(UserId(2))
            .api_key(ApiKeyId(3))
            .client(ClientId(5))
            .route(RouteId(4));
        let mut names = Vec::new();
        for (i, kind) in ScopeKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), i, "{kind} out of place in ALL");
            let scope = Scope::of(&full, kind).expect("a full request names every kind");
            assert_eq!(scope.kind(), kind);
            assert!(!names.contains(&kind.name()), "{kind} named twice");
            names.push(kind.name());
            if kind != ScopeKind::Global {
                assert_eq!(
                    Scope::of(&Request::new(), kind),
                    None,
                    "{kind} without a key"
                );
            }
        }
        assert_eq!(names.len(), ScopeKind::COUNT);
    }
}
