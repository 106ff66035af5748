#pragma once
/// \file
/// The old path of <zero/backend/adamw_args.hpp>, kept for one release (docs/api.md, CHANGELOG.md): zero 0.2.0
/// moved the header to backend/, below optim, because it is the contract of the backends' `adamw_step` kernel.
/// Code that includes this path still compiles, with a message saying where the header went; the path goes away
/// in zero 0.3.0. Define ZERO_NO_DEPRECATION_MESSAGES to silence the message (Clang reports `#pragma message` as
/// a -W#pragma-messages warning, which -Werror turns into an error).

#include "zero/backend/adamw_args.hpp"

#ifndef ZERO_NO_DEPRECATION_MESSAGES
#pragma message("zero: <zero/optim/adamw_args.hpp> is deprecated: include <zero/backend/adamw_args.hpp> (gone in 0.3)")
#endif
