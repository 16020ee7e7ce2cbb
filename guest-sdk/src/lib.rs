//! Placeholder: the guest SDK for policy plugins arrives with the plugin issue.
