//! Sentinel discovery against scripted sentinels and servers.

use super::*;
