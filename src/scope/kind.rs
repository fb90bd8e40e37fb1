//! Scope kinds and typed scope keys: who shares a budget.

use std::fmt;

use crate::scope::rules::Request;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// A plain number: map your own identifiers (database ids, interned names) to it
        /// once, outside the hot path. `Display` prints the number.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);

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

/// The one list of keyed scope kinds, in lock order (the global kind comes first and has
/// no key). Each line: the kind's docs, its variant, its name, and the [`Request`] fields
/// that make its key, with their types.
///
/// Adding a kind is one line here and its field on [`Request`]: [`ScopeKind`], [`Scope`]
/// (variant, kind, `Display`), a request's scopes, the limiter's maps and their lock
/// order are generated from this list, and everything else matches on [`ScopeKind`]
/// exhaustively or iterates [`ScopeKind::ALL`], so the compiler finds what is left.
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
            pub fn name(self) -> &'static str {
                match self {
                    ScopeKind::Global => "global",
                    $(ScopeKind::$kind => $name,)*
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
    /// Position in [`ScopeKind::ALL`].
    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ScopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One value per scope kind, indexed by [`ScopeKind::index`].
pub(crate) type PerKind<T> = [T; ScopeKind::COUNT];

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
