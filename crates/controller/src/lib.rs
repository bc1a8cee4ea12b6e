//! The TenantCluster controller: dereference → validate → build → apply → observe → status.
//! It grows here in the controller milestone; the resource types live in `tenantplane-api`.
