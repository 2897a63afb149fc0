//! [`store_trait!`]: each trait of the store declared once, from its methods' signatures, with
//! the two implementations every trait gets without a body of its own: a shared store
//! (`Arc<S>`) and a timed one ([`Timed`](super::timed::Timed)). A method added to a trait is
//! written there and in the stores that keep state (memory, Redis), nowhere else.

/// Declares a trait of the store and, from the same list of signatures, writes:
/// - the trait itself, `Send + Sync + 'static` (a coordinator shares its store between tasks),
///   each `async fn` declared as a `fn` returning `impl Future<Output = ...> + Send`: native
///   async, no boxing, as a store call is on every step's path;
/// - `impl<S: Trait> Trait for Arc<S>`: a shared store is a store, so that two coordinators (or
///   a coordinator and a test) can use one;
/// - `impl<S: Trait> Trait for Timed<S>`: each call timed under the method's name, which is the
///   `operation` label of the store's latency in `/metrics`, unless the method is marked
///   `#[untimed = "why"]` (then it is only forwarded).
///
/// A method takes `&self` and named arguments, and carries doc comments (its contract) and
/// then, optionally, its `#[untimed = "why"]`; nothing else.
macro_rules! store_trait {
    (
        $(#[$trait_attr:meta])*
        pub trait $Trait:ident {
            $(
                $(#[doc = $doc:literal])*
                $(#[untimed = $why_untimed:literal])?
                async fn $method:ident(&self $(, $arg:ident: $Arg:ty)* $(,)?) -> $Output:ty;
            )*
        }
    ) => {
        $(#[$trait_attr])*
        pub trait $Trait: Send + Sync + 'static {
            $(
                $(#[doc = $doc])*
                fn $method(&self $(, $arg: $Arg)*)
                    -> impl ::std::future::Future<Output = $Output> + Send;
            )*
        }

        impl<S: $Trait> $Trait for ::std::sync::Arc<S> {
            $(
                fn $method(&self $(, $arg: $Arg)*)
                    -> impl ::std::future::Future<Output = $Output> + Send {
                    S::$method(self $(, $arg)*)
                }
            )*
        }

        impl<S: $Trait> $Trait for $crate::store::timed::Timed<S> {
            $(
                async fn $method(&self $(, $arg: $Arg)*) -> $Output {
                    $crate::store::declare::store_trait!(
                        @forward self, $method, [$($why_untimed)?], ($($arg),*)
                    )
                }
            )*
        }
    };
    (@forward $self:ident, $method:ident, [], ($($arg:ident),*)) => {
        $self
            .time(stringify!($method), $self.inner().$method($($arg),*))
            .await
    };
    (@forward $self:ident, $method:ident, [$why_untimed:literal], ($($arg:ident),*)) => {
        $self.inner().$method($($arg),*).await
    };
}

pub(super) use store_trait;
