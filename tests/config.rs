//! Feature `serde`: limits and algorithms load from a gateway's TOML or JSON config in the
//! same string form as `FromStr`, round-trip, and a bad entry is an error naming it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde::{Deserialize, Serialize};
use slidegate::{Algorithm, Limit, Limiter};

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
