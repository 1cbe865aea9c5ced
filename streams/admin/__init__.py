"""Commands an administrator runs on the cluster for the router (`acls`)."""
