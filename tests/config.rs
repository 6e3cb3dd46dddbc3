//! Feature `serde`: limits and algorithms load from a gateway's TOML or JSON config in the
//! same string form as `FromStr`, and so do named policies (`PolicyConfig`); they
//! round-trip, and a bad entry is an error naming it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde::{Deserialize, Serialize};
use slidegate::{Algorithm, ConfigError, Limit, Limiter, PolicyConfig};

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Route {
    path: String,
    algorithm: Algorithm,
    limits: Vec<Limit>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Gateway {
    routes: Vec<Route>,
}

const CONFIG: &str = r#"
[[routes]]
path = "/login"
algorithm = "SlidingWindow"
limits = ["5/min strict"]

[[routes]]
path = "/api"
algorithm = "Gcra"
limits = ["10/s", "120/min", "240/h@1min"]
"#;

#[test]
fn a_gateway_config_loads_builds_and_round_trips() {
    let config: Gateway = toml::from_str(CONFIG).unwrap();
    assert_eq!(config.routes[0].limits, vec![Limit::per_minute(5).strict()]);
    assert_eq!(config.routes[1].algorithm, Algorithm::Gcra);
    assert_eq!(
        config.routes[1].limits[2],
        Limit::per_hour(240).precision(std::time::Duration::from_secs(60))
    );
    for route in &config.routes {
        let mut builder = Limiter::<u64>::builder().algorithm(route.algorithm);
        for limit in &route.limits {
            builder = builder.limit(*limit);
        }
        let limiter = builder.build().unwrap();
        assert!(limiter.check(&1).is_allowed(), "{}", route.path);
    }
    // TOML and JSON round trips, through the canonical strings.
    let again: Gateway = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, config);
    let json = serde_json::to_string(&config).unwrap();
    assert!(json.contains(r#""limits":["10/s","120/min","240/h"]"#), "{json}");
    assert_eq!(serde_json::from_str::<Gateway>(&json).unwrap(), config);
}

#[test]
fn a_bad_limit_in_a_config_is_an_error_that_names_it() {
    let bad = CONFIG.replace("\"120/min\"", "\"120 per minute\"");
    let err = toml::from_str::<Gateway>(&bad).unwrap_err().to_string();
    assert!(err.contains("120 per minute"), "{err}");
    let zero = serde_json::from_str::<Limit>(r#""0/s""#).unwrap_err().to_string();
    assert!(zero.contains("max is 0"), "{zero}");
    assert!(serde_json::from_str::<Algorithm>(r#""Bucket""#).is_err());
}

/// A tiered gateway: named policies (one in shadow), a default, loaded into one limiter.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Tiers {
    default_policy: String,
    policies: std::collections::BTreeMap<String, PolicyConfig>,
}

const TIERS: &str = r#"
default_policy = "free"

[policies.free]
limits = ["10/s", "1000/h@1min"]

[policies.paid]
limits = ["100/s", "20000/h@1min"]

[policies.trial]
limits = ["5/s"]
shadow = true
"#;

#[test]
fn named_policies_load_from_a_config_and_round_trip() {
    let config: Tiers = toml::from_str(TIERS).unwrap();
    assert_eq!(config.policies["free"].limits[0], Limit::per_second(10));
    assert!(!config.policies["paid"].shadow, "shadow defaults to false");
    assert!(config.policies["trial"].shadow);
    let mut builder = Limiter::<String>::builder()
        .default_policy(&config.default_policy)
        .resolver(|key: &String| key.split_once(':').map(|(tier, _)| tier));
    for (name, policy) in &config.policies {
        builder = builder.policy(name, policy.clone());
    }
    let limiter = builder.build().unwrap();
    assert_eq!(limiter.policy_of("paid:acme"), "paid");
    assert_eq!(limiter.policy_of("bob"), "free");
    assert_eq!(limiter.check("paid:acme").remaining(), 99);
    // The shadow tier admits its sixth request in a second, saying it would not have.
    let trial: Vec<_> = (0..6).map(|_| limiter.check("trial:x")).collect();
    assert!(trial.iter().all(|d| d.is_allowed()));
    assert_eq!(trial.iter().filter(|d| d.shadow_denial().is_some()).count(), 1);
    assert_eq!(limiter.policy("trial"), Some(config.policies["trial"].clone()));

    let again: Tiers = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, config);
    let json = serde_json::to_string(&config.policies["free"]).unwrap();
    // (1 min is the default precision of an hour, so the canonical form leaves it out.)
    assert_eq!(json, r#"{"limits":["10/s","1000/h"],"shadow":false}"#);
    assert_eq!(serde_json::from_str::<PolicyConfig>(&json).unwrap(), config.policies["free"]);
}

#[test]
fn a_bad_policy_in_a_config_is_an_error_that_names_it() {
    let typo = TIERS.replace("shadow = true", "shadwo = true");
    let err = toml::from_str::<Tiers>(&typo).unwrap_err().to_string();
    assert!(err.contains("shadwo"), "{err}");
    let empty = serde_json::from_str::<PolicyConfig>(r#"{"limits": []}"#).unwrap();
    let err = Limiter::<u64>::builder().policy("gold", empty).build().unwrap_err();
    assert!(matches!(err, ConfigError::InPolicy { ref name, .. } if name == "gold"), "{err:?}");
    assert!(err.to_string().contains("gold"), "{err}");
}
