// A TCP port that is free on 127.0.0.1 right now (the kernel picks it). Another process
// may take it before it is used; callers that bind it report "address in use" clearly.
#pragma once

namespace hyperparallel::launch {

int find_free_port();

}  // namespace hyperparallel::launch
