//! slidegate's sliding window as a Redis module: `redis-server --loadmodule
//! libslidegate_redis.so` adds the command `SLIDEGATE.RUN`, which `RedisLimiter` uses for
//! its checks and peeks when the server has it (and its Lua script otherwise).
//!
//! `SLIDEGATE.RUN <first key> <numkeys> <keys...> <args...>` takes what `EVALSHA <sha>
//! <numkeys> <keys...> <args...>` of `src/redis/limiter.lua` takes, but with only each
//! entry's windows key (checks and peeks need no bookkeeping key) and the first key also in
//! front (so that a Cluster client routes it), for the modes `check` and `peek`, and returns
//! what the script returns, reading and writing the same bytes ([`window`]): five integers
//! per entry, `{kind, limit, remaining, retry_ms, now_ms}`, kind 0 admitted, 1 refused,
//! 2 cost above a limit's `max`, 3 an entry error (`{3, code, 0, 0, now}`, see
//! [`args::EntryError`]). A bad entry never fails its neighbours; only a call whose shape,
//! limits or size is wrong gets an `-ERR` ([`args`] has the caps). The window is updated in
//! place (`RedisModule_StringDMA`) and its expiry set (`RedisModule_SetExpire`); replicas
//! and the AOF receive the effect (`SET key value PX ttl`), not the command, since the
//! server's time differs on a replica.
//!
//! The command is registered with `getkeys-api`: when the server asks (ACL checks, Cluster
//! slot checks, `COMMAND GETKEYS`), it names every key the call may open
//! ([`args::key_positions`]), so a user allowed only `~slidegate:*` cannot reach any other
//! key through it, and a call naming keys of several slots is refused `CROSSSLOT`.
//!
//! The module API is reached without C: `RedisModule_OnLoad` receives the server's
//! `RedisModule_GetApi` in the context's first word (as `redismodule.h`'s
//! `RedisModule_Init` reads it) and asks it for each function used.

pub mod args;
pub mod window;

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::sync::OnceLock;

use args::EntryError;

/// The server's context of a call (opaque).
#[repr(C)]
pub struct RedisModuleCtx {
    _private: [u8; 0],
}
/// A server string (opaque).
#[repr(C)]
pub struct RedisModuleString {
    _private: [u8; 0],
}
/// An open key (opaque).
#[repr(C)]
pub struct RedisModuleKey {
    _private: [u8; 0],
}

const OK: c_int = 0;
const ERR: c_int = 1;
const APIVER_1: c_int = 1;
const READ: c_int = 1;
const WRITE: c_int = 1 << 1;
const KEYTYPE_EMPTY: c_int = 0;
const KEYTYPE_STRING: c_int = 1;
/// Key flags of `RedisModule_KeyAtPosWithFlags` (`REDISMODULE_CMD_KEY_*` in
/// `redismodule.h`): read and written, its value read and updated.
const KEY_RW: c_int = 1 << 1;
const KEY_ACCESS: c_int = 1 << 4;
const KEY_UPDATE: c_int = 1 << 5;

type CmdFunc = extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// The module API functions used, as the server hands them out.
struct Api {
    create_command: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *const c_char,
        CmdFunc,
        *const c_char,
        c_int,
        c_int,
        c_int,
    ) -> c_int,
    set_module_attribs: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, c_int, c_int),
    reply_with_long_long: unsafe extern "C" fn(*mut RedisModuleCtx, c_longlong) -> c_int,
    reply_with_error: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char) -> c_int,
    reply_with_array: unsafe extern "C" fn(*mut RedisModuleCtx, std::ffi::c_long) -> c_int,
    open_key: unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString, c_int) -> *mut RedisModuleKey,
    close_key: unsafe extern "C" fn(*mut RedisModuleKey),
    key_type: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    string_ptr_len: unsafe extern "C" fn(*const RedisModuleString, *mut usize) -> *const c_char,
    string_dma: unsafe extern "C" fn(*mut RedisModuleKey, *mut usize, c_int) -> *mut c_char,
    string_truncate: unsafe extern "C" fn(*mut RedisModuleKey, usize) -> c_int,
    set_expire: unsafe extern "C" fn(*mut RedisModuleKey, c_longlong) -> c_int,
    replicate: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...) -> c_int,
    milliseconds: unsafe extern "C" fn() -> c_longlong,
    is_keys_position_request: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    key_at_pos: unsafe extern "C" fn(*mut RedisModuleCtx, c_int),
    /// Redis 7 and later (flags say how each key is used); `key_at_pos` before.
    key_at_pos_with_flags: Option<unsafe extern "C" fn(*mut RedisModuleCtx, c_int, c_int)>,
}

static API: OnceLock<Api> = OnceLock::new();

type GetApi = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;

/// Asks the server for `name`'s function pointer.
///
/// # Safety
/// `get_api` is the server's `RedisModule_GetApi`, and `F` the function pointer type of
/// `name` in `redismodule.h`.
unsafe fn lookup<F: Copy>(get_api: GetApi, name: &CStr) -> Option<F> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `get_api` is the server's, per the contract; it writes a function pointer
    // into `ptr` or returns an error.
    if unsafe { get_api(name.as_ptr(), &mut ptr) } != OK || ptr.is_null() {
        return None;
    }
    // SAFETY: `F` is a function pointer type (the size of a pointer) matching the function's
    // C signature, per the contract.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
}

/// Called by the server when it loads the module.
///
/// # Safety
/// Called by Redis with a valid context, as the module API documents.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the server puts `RedisModule_GetApi` in the context's first word, which is
    // what `redismodule.h`'s `RedisModule_Init` reads.
    let get_api: GetApi =
        unsafe { std::mem::transmute_copy::<*mut c_void, GetApi>(&*ctx.cast::<*mut c_void>()) };
    // SAFETY: each name is paired with its signature from `redismodule.h`.
    let api = unsafe {
        (|| {
            Some(Api {
                create_command: lookup(get_api, c"RedisModule_CreateCommand")?,
                set_module_attribs: lookup(get_api, c"RedisModule_SetModuleAttribs")?,
                reply_with_long_long: lookup(get_api, c"RedisModule_ReplyWithLongLong")?,
                reply_with_error: lookup(get_api, c"RedisModule_ReplyWithError")?,
                reply_with_array: lookup(get_api, c"RedisModule_ReplyWithArray")?,
                open_key: lookup(get_api, c"RedisModule_OpenKey")?,
                close_key: lookup(get_api, c"RedisModule_CloseKey")?,
                key_type: lookup(get_api, c"RedisModule_KeyType")?,
                string_ptr_len: lookup(get_api, c"RedisModule_StringPtrLen")?,
                string_dma: lookup(get_api, c"RedisModule_StringDMA")?,
                string_truncate: lookup(get_api, c"RedisModule_StringTruncate")?,
                set_expire: lookup(get_api, c"RedisModule_SetExpire")?,
                replicate: lookup(get_api, c"RedisModule_Replicate")?,
                milliseconds: lookup(get_api, c"RedisModule_Milliseconds")?,
                is_keys_position_request: lookup(get_api, c"RedisModule_IsKeysPositionRequest")?,
                key_at_pos: lookup(get_api, c"RedisModule_KeyAtPos")?,
                key_at_pos_with_flags: lookup(get_api, c"RedisModule_KeyAtPosWithFlags"),
            })
        })()
    };
    let Some(api) = api else { return ERR };
    let api = API.get_or_init(|| api);
    // SAFETY: `ctx` is the loading context; the strings are NUL-terminated statics.
    unsafe {
        (api.set_module_attribs)(ctx, c"slidegate".as_ptr(), 1, APIVER_1);
        // `getkeys-api`, no static key range: the server asks the command for its keys
        // (`args::key_positions`), so ACLs and Cluster slot checks see every key it opens.
        (api.create_command)(
            ctx,
            c"slidegate.run".as_ptr(),
            run_command,
            c"write deny-oom getkeys-api".as_ptr(),
            0,
            0,
            0,
        )
    }
}

/// The bytes of argument `s`.
///
/// # Safety
/// `s` is a valid module string that outlives `'a` (the command's arguments do).
unsafe fn bytes<'a>(api: &Api, s: *mut RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: per the contract; the server returns a pointer to `len` bytes it owns.
    unsafe {
        let ptr = (api.string_ptr_len)(s, &mut len);
        if ptr.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(ptr.cast::<u8>(), len)
    }
}

extern "C" fn run_command(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    let Some(api) = API.get() else { return ERR };
    let strings: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: the server passes `argc` valid argument pointers.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    };
    // SAFETY: every argument is a valid string for the command's duration.
    let args: Vec<&[u8]> = strings.iter().map(|&s| unsafe { bytes(api, s) }).collect();
    // SAFETY: `ctx` is the command's context.
    if unsafe { (api.is_keys_position_request)(ctx) } != 0 {
        // The server asks which arguments are keys (ACLs, Cluster slot checks, COMMAND
        // GETKEYS): every key the call may open, read and written in place.
        for position in args::key_positions(&args) {
            let Ok(position) = c_int::try_from(position) else { break };
            // SAFETY: `ctx` is the key-position request's context, `position` < argc.
            unsafe {
                match api.key_at_pos_with_flags {
                    Some(with_flags) => with_flags(ctx, position, KEY_RW | KEY_ACCESS | KEY_UPDATE),
                    None => (api.key_at_pos)(ctx, position),
                }
            }
        }
        return OK;
    }
    let call = match args::parse(&args) {
        Ok(call) => call,
        // SAFETY: `ctx` is the command's context; the message is a NUL-terminated static.
        Err(error) => return unsafe { (api.reply_with_error)(ctx, error.message().as_ptr()) },
    };
    // SAFETY: no arguments; the server's clock in ms.
    let server_now = call.now.unwrap_or_else(|| unsafe { (api.milliseconds)() });
    let mut replies = Vec::with_capacity(call.entries.len().saturating_mul(5));
    for entry in &call.entries {
        let reply = match entry {
            Ok(entry) => match strings.get(entry.key) {
                // SAFETY: `ctx` is the command's context and `name` one of its arguments.
                Some(&name) => unsafe { run_entry(api, ctx, name, entry, &call, server_now) },
                None => EntryError::Key.reply(server_now),
            },
            Err(error) => error.reply(server_now),
        };
        replies.extend(reply);
    }
    // SAFETY: `ctx` is the command's context.
    unsafe {
        (api.reply_with_array)(ctx, std::ffi::c_long::try_from(replies.len()).unwrap_or(0));
        for value in replies {
            (api.reply_with_long_long)(ctx, value);
        }
    }
    OK
}

/// One entry on key `name`: its five replies (an entry error if the key holds another type
/// or cannot be opened).
///
/// # Safety
/// `ctx` is the running command's context and `name` one of its arguments (declared to the
/// server by [`args::key_positions`]).
unsafe fn run_entry(
    api: &Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    entry: &args::Entry,
    call: &args::Call,
    server_now: i64,
) -> [i64; 5] {
    // SAFETY: per the contract; the key is closed below, and the DMA pointer is used only
    // while it is open, for the length the server gave.
    unsafe {
        let key = (api.open_key)(ctx, name, READ | WRITE);
        if key.is_null() {
            return EntryError::Key.reply(server_now);
        }
        let kind = (api.key_type)(key);
        if kind != KEYTYPE_EMPTY && kind != KEYTYPE_STRING {
            (api.close_key)(key);
            return EntryError::WrongType.reply(server_now);
        }
        let state = if kind == KEYTYPE_STRING {
            let mut len = 0usize;
            let ptr = (api.string_dma)(key, &mut len, READ);
            // A string of another length is another layout's (no state): not copied.
            (!ptr.is_null() && len == call.layout.length)
                .then(|| std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec())
        } else {
            None
        };
        let outcome = window::run(&call.layout, state.as_deref(), server_now, entry.mode, entry.cost);
        if let Some(written) = &outcome.written {
            let mut len = 0usize;
            let same = state.as_ref().is_some_and(|s| s.len() == written.len());
            if !same {
                (api.string_truncate)(key, written.len());
            }
            let ptr = (api.string_dma)(key, &mut len, WRITE);
            if !ptr.is_null() && len == written.len() {
                std::ptr::copy_nonoverlapping(written.as_ptr(), ptr.cast::<u8>(), len);
            }
            (api.set_expire)(key, call.ttl);
            // Replicas and the AOF get the effect, not the command: the server's time
            // differs on a replica.
            (api.replicate)(
                ctx,
                c"SET".as_ptr(),
                c"sbcl".as_ptr(),
                name,
                written.as_ptr().cast::<c_char>(),
                written.len(),
                c"PX".as_ptr(),
                c_longlong::from(call.ttl),
            );
        }
        (api.close_key)(key);
        outcome.reply
    }
}
