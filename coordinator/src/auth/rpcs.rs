//! Which role each RPC needs: a function of the gRPC path, nothing else.

use super::principals::{Principal, Role};

/// What a call needs before it reaches its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Health checks: probes carry no credentials.
    Nothing,
    /// Any principal the coordinator knows (server reflection).
    Someone,
    Role(Role),
    /// Any one of these roles.
    AnyOf(&'static [Role]),
}

impl Needs {
    /// Whether `principal` has what this needs (`Nothing` and `Someone` ask for no role).
    pub fn met_by(self, principal: &Principal) -> bool {
        match self {
            Needs::Nothing | Needs::Someone => true,
            Needs::Role(role) => principal.has(role),
            Needs::AnyOf(roles) => roles.iter().any(|role| principal.has(*role)),
        }
    }

    /// The roles that would do, for a refusal: `` `submit` or `operate` ``.
    pub fn roles(self) -> String {
        let roles: &[Role] = match &self {
            Needs::Nothing | Needs::Someone => &[],
            Needs::Role(role) => std::slice::from_ref(role),
            Needs::AnyOf(roles) => roles,
        };
        roles
            .iter()
            .map(|role| format!("`{}`", role.name()))
            .collect::<Vec<_>>()
            .join(" or ")
    }
}

/// CancelRun and RetryRun: a submitter's of its own runs (the service checks the run's owner),
/// an operator's of any.
const CHANGE_A_RUN: &[Role] = &[Role::Submit, Role::Operate];

/// The role `path` (`/package.Service/Method`) needs. An unknown path needs someone, so that
/// an anonymous caller learns nothing, not even that a method does not exist.
pub fn needs(path: &str) -> Needs {
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""));
    match (service, method) {
        ("grpc.health.v1.Health", _) => Needs::Nothing,
        ("baton.v1.RunService", "SubmitRun") => Needs::Role(Role::Submit),
        ("baton.v1.RunService", "CancelRun" | "RetryRun") => Needs::AnyOf(CHANGE_A_RUN),
        ("baton.v1.RunService", "DecideApproval") => Needs::Role(Role::Approve),
        (
            "baton.v1.RunService",
            "GetRun" | "ListRuns" | "WatchRun" | "QueryDecisions" | "VerifyRun" | "GetStats",
        ) => Needs::Role(Role::Read),
        ("baton.v1.WorkerService", _) => Needs::Role(Role::Worker),
        _ => Needs::Someone,
    }
}

/// The method's name, for messages: `DecideApproval`.
pub fn method(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_service_method_needs_a_role() {
        let descriptor = baton_proto::v1::run_service_server::SERVICE_NAME;
        assert_eq!(descriptor, "baton.v1.RunService");
        for method in [
            "SubmitRun",
            "GetRun",
            "ListRuns",
            "WatchRun",
            "CancelRun",
            "RetryRun",
            "DecideApproval",
            "GetStats",
            "QueryDecisions",
            "VerifyRun",
        ] {
            let path = format!("/baton.v1.RunService/{method}");
            assert!(
                matches!(needs(&path), Needs::Role(_) | Needs::AnyOf(_)),
                "{path}"
            );
        }
        assert_eq!(
            needs("/baton.v1.WorkerService/TaskStream"),
            Needs::Role(Role::Worker)
        );
        assert_eq!(needs("/grpc.health.v1.Health/Check"), Needs::Nothing);
        assert_eq!(
            needs("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            Needs::Someone
        );
        assert_eq!(method("/baton.v1.RunService/GetRun"), "GetRun");
        assert_eq!(
            needs("/baton.v1.RunService/CancelRun").roles(),
            "`submit` or `operate`"
        );
    }
}
