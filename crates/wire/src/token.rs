//! API tokens besides the configured admin token: what a caller asks for, what the cluster state
//! keeps of a token (a hash of its secret, never the secret), and what the API shows of one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::job::{check_token, FieldError};

/// Longest token name.
pub const NAME_MAX: usize = 64;

/// A token to create: for one tenant (`tenant`) or an admin (`"admin": true`), never both.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    /// The tenant whose jobs, runs, tickets and dead letters the token reaches (1-64 of
    /// A-Z a-z 0-9 _ -). Absent for an admin token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub tenant: Option<String>,
    /// An admin token: every endpoint, every tenant.
    #[serde(default)]
    pub admin: bool,
    /// What the token is for, shown in the list (1-64 printable characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 64)]
    pub name: Option<String>,
    /// When the token stops working (RFC 3339, in the future). Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl TokenSpec {
    /// Checks the spec at `now`, naming the offending field.
    pub fn validate(&self, now: DateTime<Utc>) -> Result<(), FieldError> {
        match (&self.tenant, self.admin) {
            (Some(_), true) => {
                return Err(FieldError::new(
                    "admin",
                    "a token is for one tenant or an admin, not both",
                ))
            }
            (None, false) => {
                return Err(FieldError::new(
                    "tenant",
                    "give a tenant, or \"admin\": true for an admin token",
                ))
            }
            (Some(t), false) => check_token("tenant", t, 64)?,
            (None, true) => {}
        }
        if let Some(name) = &self.name {
            let printable = name.chars().all(|c| !c.is_control());
            if name.is_empty() || name.chars().count() > NAME_MAX || !printable {
                return Err(FieldError::new(
                    "name",
                    format!("must be 1-{NAME_MAX} printable characters"),
                ));
            }
        }
        if self.expires_at.is_some_and(|at| at <= now) {
            return Err(FieldError::new("expires_at", "must be in the future"));
        }
        Ok(())
    }
}

/// A token as the cluster state keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: Uuid,
    /// None: an admin token.
    pub tenant: Option<String>,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    /// SHA-256 of the secret, lower-case hex.
    pub secret_sha256: String,
}

/// A token as the API shows it: never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub admin: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl From<&TokenRecord> for TokenView {
    fn from(r: &TokenRecord) -> TokenView {
        TokenView {
            id: r.id,
            tenant: r.tenant.clone(),
            admin: r.tenant.is_none(),
            name: r.name.clone(),
            created_at: r.created_at,
            expires_at: r.expires_at,
        }
    }
}

/// A token just created: the only answer that carries its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// The bearer token to present (`Authorization: Bearer …`). Shown this once: only a hash
    /// of it is kept.
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tenant: Option<&str>, admin: bool) -> TokenSpec {
        TokenSpec {
            tenant: tenant.map(str::to_string),
            admin,
            name: None,
            expires_at: None,
        }
    }

    #[test]
    fn a_token_is_for_one_tenant_or_an_admin() {
        let now = Utc::now();
        assert!(spec(Some("acme"), false).validate(now).is_ok());
        assert!(spec(None, true).validate(now).is_ok());
        assert_eq!(
            spec(Some("acme"), true).validate(now).unwrap_err().field,
            "admin"
        );
        assert_eq!(spec(None, false).validate(now).unwrap_err().field, "tenant");
        assert_eq!(
            spec(Some("a b"), false).validate(now).unwrap_err().field,
            "tenant"
        );
        let mut s = spec(Some("acme"), false);
        s.name = Some("x".repeat(65));
        assert_eq!(s.validate(now).unwrap_err().field, "name");
        s.name = Some("ci\npipeline".into());
        assert_eq!(s.validate(now).unwrap_err().field, "name");
        s.name = Some("ci pipeline".into());
        s.expires_at = Some(now);
        assert_eq!(s.validate(now).unwrap_err().field, "expires_at");
        s.expires_at = Some(now + chrono::Duration::seconds(1));
        assert!(s.validate(now).is_ok());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = serde_json::from_str::<TokenSpec>(r#"{"tenant":"a","scope":"all"}"#).unwrap_err();
        assert!(e.to_string().contains("scope"), "{e}");
    }
}
